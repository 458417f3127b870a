"""Rejecting a drop: its reasons in ``status/<bundle>.json`` and the log, the drop quarantined.

Intake rejects the drops it judged; the daemon rejects the drop its intake child was
taking in when the child was killed (the out-of-memory killer: see
:mod:`service.daemon.intake_runner`). Neither needs the verification stack, so the
daemon can reject without importing it.

A refused drop never leaves the node without its driver: when the bundle's active
generation is for the running kernel and some of the modules boot loaded for it have
left the kernel (the GPU operator's new driver pod unloads the old driver before its
container drops), that generation is made pending again, so a reboot brings it back (a
generation pending for another kernel is displaced and stays carried for it), and the
refused drop is recorded, so the boot publishes the config digest it carried
(:meth:`~service.bundles.state.BundleState.after_refusal`).
"""

from __future__ import annotations

import contextlib
import os
import time
from dataclasses import dataclass
from pathlib import Path

from service import faults
from service.bundles.phase import Phase
from service.bundles.records import RefusedDrop
from service.bundles.state import BundleState, State
from service.bundles.statefile import load, save
from service.config import Config
from service.dropfs import open_dir
from service.errors import ServiceError
from service.host.modules import live_modules
from service.host.running import RunningHost
from service.host.sysfs import Sysfs
from service.intake.drops import Drops
from service.intake.outcome import Outcome
from service.layout import Layout
from service.logs import get_logger
from service.publish.announce import HOST_FILE
from service.publish.bundle_status import write_status
from service.publish.operator import read_digest
from stager.schema.shown import bounded, shown

log = get_logger("modstage.intake")
MAX_STATUS_FILES = 64  # status files a rejection may create for names state.json does not know
MAX_REFUSED_REASON = 200  # the reason a refused drop's record keeps (the status file has all)


class _NoStatus(Exception):
    """This rejection leaves no status file (see :func:`may_keep_status`)."""


@dataclass(frozen=True)
class Carried:
    """What intake read of a drop before refusing it (None where it got no further)."""

    version: str | None = None  # its manifest's
    generation: str | None = None  # the id its manifest would have had
    digest: str | None = None  # the config digest it carried
    kernel: str | None = None  # the release its manifest targets (its quarantine record's)


def reject(
    layout: Layout,
    config: Config,
    drops: Drops,
    drop: Path,
    bundle: str | None,
    reasons: list[str],
    carried: Carried | None = None,
) -> Outcome:
    """Record a rejection (status, log), bring the active generation back if it left the
    kernel (:func:`_after_refusal`), and move the drop to the quarantine.

    ``carried`` is what intake read of the drop; without it (the daemon's rejection, or
    a manifest intake could not read) the drop's config digest is read here, if it can be.
    """
    kept = str(layout.quarantine / drop.name)  # where the drop goes: the path an admin opens
    shown_reasons = bounded([r.replace(str(drop), kept) for r in reasons])
    log.warning("drop.rejected", drop=drop.name, bundle=bundle, reasons=shown_reasons)
    if bundle is not None:
        try:
            state = load(layout.state)
            if bundle not in state.bundles and not may_keep_status(layout, config, bundle):
                raise _NoStatus
            current = state.bundle(bundle)
            if bundle in state.bundles:
                refused = _refused(drop, reasons, carried or Carried(digest=_digest_of(drop)))
                current = _after_refusal(layout, state, bundle, refused)
            write_status(
                layout,
                bundle,
                current,
                phase=Phase.REJECTED,
                errors=shown_reasons,
                drop=drop.name,
            )
            faults.hit("intake.rejected")
        except _NoStatus:
            pass
        except (OSError, ServiceError) as exc:  # a full disk, a corrupt state: logged
            log.error("status.unwritable", bundle=bundle, error=shown(exc))
    drops.quarantine(drop, bundle, shown_reasons, carried.kernel if carried else None)
    return Outcome(drop, bundle, None, False, tuple(shown_reasons))


def _after_refusal(layout: Layout, state: State, name: str, refused: RefusedDrop) -> BundleState:
    """Take :meth:`~service.bundles.state.BundleState.after_refusal` and save it if it
    changed anything; the bundle as it is now."""
    before = state.bundle(name)
    after = before.after_refusal(refused, unloaded(layout, before))
    if after is before:
        return before
    save(layout.state, state.with_bundle(name, after), step=after.phase.value)
    if after.phase is not before.phase:
        log.warning(
            "generation.reloading",
            bundle=name,
            generation=after.pending,
            reason="its modules left the kernel and the drop after them was refused",
            digest=refused.digest,
        )
    else:
        log.info("drop.refused_recorded", bundle=name, digest=refused.digest)
    return after


def unloaded(layout: Layout, bundle: BundleState) -> bool:
    """Whether ``bundle``'s active generation came up by its records (boot recorded its
    loads; not held), is for the running kernel, and some of the modules boot loaded for it
    have left the kernel. Whatever the phase: a generation pending for another kernel (the
    next one's drop) leaves the bundle ``pending`` while the running kernel's driver is the
    active generation's."""
    gen = bundle.generations.get(bundle.active) if bundle.active else None
    if gen is None or bundle.held or not bundle.loaded:
        return False
    if gen.kernel != RunningHost.read(layout).need_release():
        return False
    live = live_modules(Sysfs(layout.sys))
    return any(m.module not in live for m in bundle.loaded)


def _refused(drop: Path, reasons: list[str], carried: Carried) -> RefusedDrop:
    """The record of a refused drop: what it carried, and its first reason without its path."""
    first = reasons[0] if reasons else "no reason given"
    for prefix in (f"{drop}/", f"{drop}: "):
        first = first.removeprefix(prefix)
    return RefusedDrop(
        round(time.time(), 3),
        shown(first, MAX_REFUSED_REASON),
        carried.version,
        carried.generation,
        carried.digest,
    )


def _digest_of(drop: Path) -> str | None:
    """The config digest ``drop`` carries, None if none or unreadable."""
    with contextlib.suppress(ServiceError, OSError):
        fd = open_dir(drop)
        try:
            return read_digest(fd, drop)
        finally:
            os.close(fd)
    return None


def may_keep_status(layout: Layout, config: Config, bundle: str) -> bool:
    """Whether a rejection of ``bundle`` may leave a status file.

    Not for a bundle this host does not allow, nor for a new name once
    :data:`MAX_STATUS_FILES` exist: rejected names must not grow files without bound.
    """
    allowed = config.allowed_bundles
    if allowed and bundle not in allowed:
        return False
    if (layout.status / f"{bundle}.json").exists():
        return True
    try:
        entries = (e for e in layout.status.iterdir() if e.name != HOST_FILE)
        count = sum(1 for _, _n in zip(entries, range(MAX_STATUS_FILES), strict=False))
    except OSError:
        count = 0
    return count < MAX_STATUS_FILES

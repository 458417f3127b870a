"""Rejecting a drop: its reasons in ``status/<bundle>.json`` and the log, the drop quarantined.

Intake rejects the drops it judged; the daemon rejects the drop its intake child was
taking in when the child was killed (the out-of-memory killer: see
:mod:`service.daemon.intake_runner`). Neither needs the verification stack, so the
daemon can reject without importing it.
"""

from __future__ import annotations

from pathlib import Path

from service import faults
from service.config import Config
from service.errors import ServiceError
from service.layout import Layout
from service.logs import get_logger
from service.store.drops import Drops
from service.store.outcome import Outcome
from service.store.phase import Phase
from service.store.statefile import load
from service.store.statusfile import write_status
from stager.shown import bounded, shown

log = get_logger("modstage.intake")
MAX_STATUS_FILES = 64  # status files a rejection may create for names state.json does not know


class _NoStatus(Exception):
    """This rejection leaves no status file (see :func:`may_keep_status`)."""


def reject(
    layout: Layout, config: Config, drops: Drops, drop: Path, bundle: str | None, reasons: list[str]
) -> Outcome:
    """Record a rejection (status, log) and move the drop to the quarantine."""
    shown_reasons = bounded(reasons)
    log.warning("drop.rejected", drop=drop.name, bundle=bundle, reasons=shown_reasons)
    if bundle is not None:
        try:
            state = load(layout.state)
            if bundle not in state.bundles and not may_keep_status(layout, config, bundle):
                raise _NoStatus
            write_status(
                layout,
                bundle,
                state.bundle(bundle),
                phase=Phase.REJECTED,
                errors=shown_reasons,
                drop=drop.name,
            )
            faults.hit("intake.rejected")
        except _NoStatus:
            pass
        except (OSError, ServiceError) as exc:  # a full disk, a corrupt state: logged
            log.error("status.unwritable", bundle=bundle, error=shown(exc))
    drops.quarantine(drop, bundle, shown_reasons)
    return Outcome(drop, bundle, None, False, tuple(shown_reasons))


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
        entries = layout.status.iterdir()
        count = sum(1 for _, _n in zip(entries, range(MAX_STATUS_FILES), strict=False))
    except OSError:
        count = 0
    return count < MAX_STATUS_FILES

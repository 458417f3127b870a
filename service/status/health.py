"""Whether a bundle is healthy, decided from plain values (its state, status file, the kernel).

Nothing here reads or writes a file: :func:`bundle_health` takes what
:mod:`service.status.survey` read and returns a :class:`Verdict`.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from enum import IntEnum

from service.kernel.pci import Devices
from service.status.live import LiveModule, module_mismatches
from service.store.phase import Phase
from service.store.state import BundleState, Generation
from stager.statusfile import StatusFile


class Health(IntEnum):
    """How a bundle (or the host) is doing, ordered from best to worst; :attr:`code` is
    ``status``'s exit code (``upgrading`` came later: its code is 4)."""

    HEALTHY = 0
    UPGRADING = 1
    DEGRADED = 2
    FAILED = 3

    @property
    def label(self) -> str:
        """The lowercase name used in JSON and tables."""
        return self.name.lower()

    @property
    def code(self) -> int:
        """The exit code of ``status`` (and the ``modstage_health`` metric's value)."""
        return _CODES[self]


_CODES = {Health.HEALTHY: 0, Health.DEGRADED: 1, Health.FAILED: 2, Health.UPGRADING: 4}


@dataclass(frozen=True)
class Verdict:
    """A health and the reasons for it, in plain words."""

    health: Health
    reasons: tuple[str, ...] = ()
    upgrading: Upgrading | None = None  # set when the bundle is upgrading (or was, past the bound)
    grades: tuple[Health, ...] = ()  # each reason's own health (the worst is ``health``)


#: how long after the driver pod's modules were unloaded its drop may take to arrive (the
#: new pod's image pulled and its container started) before the missing modules are a failure
DROP_GRACE = 15 * 60.0
#: the operator's readiness file: the driver pod's startup probe writes it, its preStop
#: removes it (so it is absent while a driver pod is being replaced)
DRIVER_POD_READY = "/run/nvidia/validations/.driver-ctr-ready"


@dataclass(frozen=True)
class Unloads:
    """What the host knows of modules leaving the kernel, for telling an upgrade from a
    failure: when each left in this boot (the daemon's record of the kernel's uevents),
    whether the operator's driver pod is ready (None: no operator on this host), the time
    now and the bound (seconds) past which an upgrade is a failure."""

    at: Mapping[str, float]
    pod_ready: bool | None
    now: float
    bound: float
    grace: float = DROP_GRACE


@dataclass(frozen=True)
class Upgrading:
    """A bundle between its driver's unload and the boot that loads its pending generation
    (or the drop that brings one, for :data:`DROP_GRACE`)."""

    to: str | None  # the pending generation (None: the new driver pod's drop is not in yet)
    version: str | None
    since: float  # counted from: the first unload the daemon saw, else the pending's record
    unload_seen: bool  # ``since`` is the unload itself
    limit: float  # seconds it may last (the bound, or the drop's grace) before it is failed
    now: float

    @property
    def seconds(self) -> float:
        """How long the bundle has been without its driver (at least)."""
        return max(0.0, self.now - self.since)

    @property
    def expired(self) -> bool:
        """It lasted past its limit: a failure."""
        return self.seconds > self.limit


Finding = tuple[Health, str]


def bundle_health(
    bundle: BundleState | None,
    status_doc: StatusFile | None,
    *,
    kernel: str | None,
    boot_id: str | None = None,
    state_boot_id: str | None = None,
    live: Mapping[str, LiveModule | None] | None = None,
    devices: Devices | None = None,
    unloads: Unloads | None = None,
) -> Verdict:
    """Judge one bundle from its state and its last status file.

    failed: the bundle's last load failed and nothing of it is loaded.
    degraded: a generation newer than the active one failed (the last known
    good runs), the last drop was rejected (and what became of the active generation
    whose modules had left the kernel before it: :func:`_refusal_note`), a refused
    drop's pod keeps the last known good, or a load started in an earlier boot never
    finished. An active generation that targets another kernel than the running one is
    failed too: no generation of the bundle is for the running kernel, nothing of it is
    loaded (``other_kernel``, once ``modstage boot`` found so).
    With ``live`` (the kernel's view of the recorded modules): failed when a
    module recorded as loaded is not live, degraded when another build of it
    is, or when ``modstage boot`` did not run in this boot. With ``devices`` (the present
    PCI devices the loaded modules are for): degraded when it drives none of them.
    A bundle in ``no_device`` (its hardware was absent at boot) is not unhealthy for it.
    With ``unloads``: modules missing for a planned upgrade (:func:`upgrade_of`) make it
    upgrading, not failed, until the bound.
    """
    found: list[Finding] = []
    upgrading = None
    if status_doc is not None and status_doc.phase == Phase.REJECTED.value:
        why = "; ".join(status_doc.errors) or "no reason given"
        if bundle is not None:
            note = _refusal_note(bundle, live) or ""
        else:  # a name no generation has: a typo, or a container nobody runs any more
            note = (
                f"; no bundle of that name is known: modstage forget {status_doc.bundle} clears it"
            )
        found.append((Health.DEGRADED, f"the last drop was rejected: {why}{note}"))
    elif bundle is not None and (kept := _refused_keeps(bundle)):
        found.append((Health.DEGRADED, kept))
    if bundle is not None:
        found += _failures(bundle)
        if live is not None and unloads is not None and _active_here(bundle, kernel):
            missing, _ = module_mismatches(bundle.loaded, live)
            upgrading = upgrade_of(bundle, missing, unloads)
        found += _kernel_findings(bundle, kernel, live, boot_id, state_boot_id, upgrading)
        found += _device_findings(bundle, devices)
        if bundle.phase is Phase.LOADING and boot_id and state_boot_id and boot_id != state_boot_id:
            found.append(
                (
                    Health.DEGRADED,
                    "a load started in an earlier boot never finished; the next boot retries it",
                )
            )
    worst = max((h for h, _ in found), default=Health.HEALTHY)
    return Verdict(worst, tuple(r for _, r in found), upgrading, tuple(h for h, _ in found))


def _active_here(bundle: BundleState, kernel: str | None) -> bool:
    """Whether the bundle has an active generation for the running kernel."""
    active = _active(bundle)
    return active is not None and (kernel is None or active.kernel == kernel)


def _went(bundle: BundleState, phase: Phase) -> float | None:
    """When the bundle last moved into ``phase`` (None: not in its history)."""
    return next((h.at for h in reversed(bundle.history) if h.target == phase.value), None)


def upgrade_of(bundle: BundleState, missing: list[str], unloads: Unloads) -> Upgrading | None:
    """Whether the active generation's missing modules left for a planned upgrade.

    Planned: a pending generation that has not failed was recorded after the active one
    went live (the driver pod's drop, or the same generation dropped again for a new
    digest), and the modules left the kernel by an unload (the daemon saw their ``remove``
    uevents) or, unseen, at least are missing while it waits. Also planned, for
    :data:`DROP_GRACE` after the daemon saw the unload: no pending generation yet while the
    operator's driver pod is being replaced (its readiness file is gone), the seconds
    between the new pod's init container and its drop. Anything else (an ``rmmod`` with
    nothing pending, a pending generation older than the live one) is None: a failure.
    """
    if not missing:
        return None
    seen = [unloads.at[m] for m in missing if m in unloads.at]
    unloaded = min(seen) if seen else None
    gen = bundle.generations.get(bundle.pending) if bundle.pending else None
    if gen is not None and not gen.failed:
        recorded, live = _went(bundle, Phase.PENDING), _went(bundle, Phase.ACTIVE)
        if recorded is None or (live is not None and recorded < live):
            return None
        since = unloaded if unloaded is not None else recorded
        return Upgrading(
            gen.id, gen.version, since, unloaded is not None, unloads.bound, unloads.now
        )
    if bundle.pending is None and unloaded is not None and unloads.pod_ready is False:
        return Upgrading(None, None, unloaded, True, unloads.grace, unloads.now)
    return None


def span(seconds: float) -> str:
    """A duration as people say it: ``45 s``, ``3 min 12 s``, ``4 h 5 min``,
    ``6 d 23 h 1 min``."""
    s = int(max(0, seconds))
    if s < 60:
        return f"{s} s"
    if s < 3600:
        return f"{s // 60} min {s % 60} s"
    if s < 86400:
        return f"{s // 3600} h {s % 3600 // 60} min"
    return f"{s // 86400} d {s % 86400 // 3600} h {s % 3600 // 60} min"


def upgrading_reason(up: Upgrading, missing: list[str]) -> str:
    """One line: what the bundle waits for, how long it has been without its driver, and
    when that becomes a failure (or that it has)."""
    modules = ", ".join(missing)
    how = "unloaded" if up.unload_seen else "not loaded"
    since = f"{span(up.seconds)}" if up.unload_seen else f"at least {span(up.seconds)}"
    if up.to is None:
        what = (
            f"module(s) {modules} were unloaded {span(up.seconds)} ago while the driver pod "
            "is replaced; its drop has not come in yet"
        )
        limit = f"failed if it has not come within {span(up.limit)}"
        if up.expired:
            return f"{what}, past the {span(up.limit)} it may take: the drop never came"
        return f"upgrading: {what} ({limit})"
    what = (
        f"module(s) {modules} {how} for pending generation {up.to[:12]} ({up.version}); "
        f"without its driver for {since}"
    )
    if up.expired:
        return (
            f"the upgrade to {up.version} has lasted past its bound of {span(up.limit)}: "
            f"{what}; the reboot that loads it has not come"
        )
    return f"upgrading: {what}; failed if the reboot has not come within {span(up.limit)}"


def _active(bundle: BundleState) -> Generation | None:
    return bundle.generations.get(bundle.active) if bundle.active else None


def last_note(bundle: BundleState) -> str | None:
    """The newest note in the bundle's history (why it moved last), if any."""
    return next((h.note for h in reversed(bundle.history) if h.note), None)


def _name(gen: Generation | None) -> str:
    return f"{gen.id[:12]} ({gen.version})" if gen else "-"


def _refusal_note(bundle: BundleState, live: Mapping[str, LiveModule | None] | None) -> str | None:
    """What became of the active generation after the last drop was refused, when its
    modules had left the kernel (see
    :meth:`~service.store.state.BundleState.after_refusal`); None when nothing did."""
    active = _active(bundle)
    if active is None:
        return None
    waits = bundle.phase in (Phase.PENDING, Phase.REBOOT_SCHEDULED)
    if bundle.refused is not None and waits and bundle.pending == active.id:
        return (
            f"; its modules had left the kernel: the last good generation {_name(active)} "
            "is loaded again at the next reboot"
        )
    missing = module_mismatches(bundle.loaded, live)[0] if live is not None else []
    if bundle.phase is not Phase.ACTIVE:
        return None
    if not missing:  # the same refused drop again, its pod keeping the last good
        return f"; {_keeps(active)}" if bundle.refused is not None else None
    if bundle.held:
        return (
            f"; held by an admin: the last good generation {_name(active)} has left the "
            "kernel and is not loaded again while held (after modstage release, the next "
            "refused drop brings it back)"
        )
    if bundle.refused is not None:
        return (
            f"; the last good generation {_name(active)} has left the kernel again after "
            "this drop brought it back once: not reloaded again, so no reboots follow one "
            "another (a reboot loads it; a drop accepted replaces it)"
        )
    return None


def _refused_keeps(bundle: BundleState) -> str | None:
    """A refused drop recorded (its pod is the one deployed) while the last known good runs."""
    refused, active = bundle.refused, _active(bundle)
    if refused is None or active is None or bundle.phase is not Phase.ACTIVE:
        return None
    version = refused.version or "?"
    return f"the drop of version {version} was rejected ({refused.reason}): {_keeps(active)}"


def _keeps(active: Generation) -> str:
    """The last known good runs, kept by the refused drop's pod (the digest is its own)."""
    return (
        f"the last good generation {_name(active)} runs, under the refused driver pod's "
        "config digest, until a drop is accepted"
    )


def _failures(bundle: BundleState) -> list[Finding]:
    """A failed bundle, and the generation deployed if it failed at boot
    (:meth:`~service.store.state.BundleState.deployed_failure`)."""
    found: list[Finding] = []
    active = _active(bundle)
    if bundle.phase is Phase.FAILED:
        note = last_note(bundle)
        found.append((Health.FAILED, f"nothing is loaded: {note or 'the last load failed'}"))
    if gen := bundle.deployed_failure():
        runs = f"running {active.id[:12]}" if active else "no generation is active"
        why = f"generation {gen.id[:12]} ({gen.version}) failed: {gen.failed}; {runs}"
        found.append((Health.DEGRADED, why))
    return found


def _kernel_findings(
    bundle: BundleState,
    kernel: str | None,
    live: Mapping[str, LiveModule | None] | None,
    boot_id: str | None,
    state_boot_id: str | None,
    upgrading: Upgrading | None = None,
) -> list[Finding]:
    """What the running kernel says of the active generation: another kernel, or not live."""
    active = _active(bundle)
    if active is None:
        return []
    if kernel is not None and active.kernel != kernel:  # a driver-less boot: as failed
        pending = bundle.generations.get(bundle.pending) if bundle.pending else None
        if pending is not None and pending.kernel == kernel:
            then = f"pending {_name(pending)} targets it (loaded at the next boot)"
        else:
            then = f"a drop for {kernel} accepted brings it back at the next boot"
        why = (
            f"no generation for the running kernel {kernel}: nothing of it is loaded (the "
            f"active generation {_name(active)} targets kernel {active.kernel}); {then}"
        )
        return [(Health.FAILED, why)]
    if bundle.phase is Phase.OTHER_KERNEL:  # the running kernel unknown: boot's word
        return [(Health.FAILED, f"nothing of it is loaded: {last_note(bundle)}")]
    if live is None:
        return []
    return _live_findings(bundle, live, boot_id, state_boot_id, upgrading)


def _live_findings(
    bundle: BundleState,
    live: Mapping[str, LiveModule | None],
    boot_id: str | None,
    state_boot_id: str | None,
    upgrading: Upgrading | None,
) -> list[Finding]:
    """What the kernel contradicts in the record of the active generation (missing
    modules of a planned upgrade: upgrading, until it lasts past its bound)."""
    found: list[Finding] = []
    missing, differing = module_mismatches(bundle.loaded, live)
    gen = str(bundle.active)[:12]
    if missing and upgrading is not None:
        grade = Health.FAILED if upgrading.expired else Health.UPGRADING
        found.append((grade, upgrading_reason(upgrading, missing)))
    elif missing:
        found.append(
            (
                Health.FAILED,
                f"generation {gen} is recorded active but module(s) {', '.join(missing)} "
                "are not loaded in the running kernel",
            )
        )
    if differing:
        found.append(
            (Health.DEGRADED, f"another build is loaded than recorded: {', '.join(differing)}")
        )
    stale = boot_id and state_boot_id and boot_id != state_boot_id
    if stale and bundle.phase is Phase.ACTIVE:
        found.append(
            (
                Health.DEGRADED,
                f"modstage boot has not run in this boot (state was written in boot "
                f"{state_boot_id}, this is {boot_id})",
            )
        )
    return found


def _device_findings(bundle: BundleState, devices: Devices | None) -> list[Finding]:
    """A loaded bundle that drives none of the present devices it is for."""
    if devices is None or bundle.phase is not Phase.ACTIVE or not bundle.loaded:
        return []
    if devices.devices and not devices.bound:
        return [(Health.DEGRADED, f"its modules drive none of its devices: {devices.summary()}")]
    return []


def overall(healths: Iterable[Health]) -> Health:
    """The host's health: the worst of its parts (healthy when there are none)."""
    return max(healths, default=Health.HEALTHY)


def waiting_note(bundle: BundleState, kernel: str | None) -> str | None:
    """Why the bundle's pending generation does not load at the next boot, if it does not."""
    gen = bundle.generations.get(bundle.pending) if bundle.pending else None
    if gen is None or gen.failed:
        return None
    if kernel is not None and gen.kernel != kernel:
        return f"waiting for kernel {gen.kernel} (running {kernel})"
    if bundle.held:
        return "held by an admin: no reboot is asked (modstage release)"
    return None

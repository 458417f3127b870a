"""Whether a bundle is healthy, decided from plain values (its state, status file, the kernel).

Nothing here reads or writes a file: :func:`bundle_health` takes what
:mod:`service.status.survey` read and returns a :class:`Grade`. Each rule of
:data:`RULES` is one function: its docstring says its condition and its verdict, its body
checks that condition and words the reason.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from enum import IntEnum
from functools import cached_property

from service.bundles.phase import Phase
from service.bundles.state import BundleState, Generation
from service.host.pci import Devices
from service.status.live import LiveModule, module_mismatches
from service.status.upgrade import Unloads, Upgrading, upgrade_of, upgrading_reason
from stager.schema.statusfile import StatusFile


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
class Grade:
    """A health and the reasons for it, in plain words."""

    health: Health
    reasons: tuple[str, ...] = ()
    upgrading: Upgrading | None = None  # set when the bundle is upgrading (or was, past the bound)
    grades: tuple[Health, ...] = ()  # each reason's own health (the worst is ``health``)


Finding = tuple[Health, str]


@dataclass(frozen=True)
class Case:
    """What one known bundle is judged on: its state, its last status file, the running
    kernel (``kernel``: its release, None if unknown), this boot's id and the one the state
    was written in, the kernel's view of the recorded modules (``live``), the present PCI
    devices its loaded modules are for (``devices``) and what the host knows of modules
    leaving the kernel (``unloads``)."""

    bundle: BundleState
    status_doc: StatusFile | None
    kernel: str | None
    boot_id: str | None
    state_boot_id: str | None
    live: Mapping[str, LiveModule | None] | None
    devices: Devices | None
    unloads: Unloads | None

    @property
    def active(self) -> Generation | None:
        """The active generation."""
        return self.bundle.generations.get(self.bundle.active) if self.bundle.active else None

    @property
    def other_kernel(self) -> bool:
        """The active generation targets another kernel than the running one."""
        active = self.active
        return active is not None and self.kernel is not None and active.kernel != self.kernel

    @cached_property
    def upgrading(self) -> Upgrading | None:
        """The planned upgrade the active generation's missing modules left for
        (:func:`~service.status.upgrade.upgrade_of`), judged when ``live`` and ``unloads``
        are known and the generation targets the running kernel."""
        if self.live is None or self.unloads is None or self.active is None or self.other_kernel:
            return None
        missing, _ = module_mismatches(self.bundle.loaded, self.live)
        return upgrade_of(self.bundle, missing, self.unloads)

    @property
    def stale_boot(self) -> bool:
        """The state was written in another boot than this one (both known)."""
        return bool(self.boot_id and self.state_boot_id and self.boot_id != self.state_boot_id)

    @property
    def live_judged(self) -> bool:
        """The kernel's view of the active generation counts: ``live`` is known, the
        generation targets the running kernel, and boot did not find it for another."""
        return (
            self.live is not None
            and self.active is not None
            and not self.other_kernel
            and self.bundle.phase is not Phase.OTHER_KERNEL
        )

    @cached_property
    def mismatches(self) -> tuple[list[str], list[str]]:
        """The recorded modules the running kernel has not loaded, and those it has loaded
        another build of (both empty unless :attr:`live_judged`)."""
        if self.live is None or not self.live_judged:
            return [], []
        return module_mismatches(self.bundle.loaded, self.live)


Rule = Callable[[Case], Finding | None]


def _rejected_drop(c: Case) -> Finding | None:
    """The last status file says the drop was rejected: degraded, with what became of the
    active generation whose modules had left the kernel before it (:func:`_refusal_note`)."""
    if c.status_doc is None or c.status_doc.phase != Phase.REJECTED.value:
        return None
    note = _refusal_note(c) or ""
    return Health.DEGRADED, f"{_rejected(c.status_doc)}{note}"


def _refused_pod_keeps(c: Case) -> Finding | None:
    """No rejection in the status file, but a refused drop is recorded (its pod is the one
    deployed) while the last known good runs: degraded."""
    if c.status_doc is not None and c.status_doc.phase == Phase.REJECTED.value:
        return None
    refused, active = c.bundle.refused, c.active
    if refused is None or active is None or c.bundle.phase is not Phase.ACTIVE:
        return None
    version = refused.version or "?"
    return (
        Health.DEGRADED,
        f"the drop of version {version} was rejected ({refused.reason}): {_keeps(active)}",
    )


def _load_failed(c: Case) -> Finding | None:
    """The bundle's last load failed and nothing of it is loaded: failed."""
    if c.bundle.phase is not Phase.FAILED:
        return None
    return Health.FAILED, f"nothing is loaded: {last_note(c.bundle) or 'the last load failed'}"


def _deployed_failed(c: Case) -> Finding | None:
    """The generation deployed failed at boot
    (:meth:`~service.bundles.state.BundleState.deployed_failure`; the last known good runs,
    if any): degraded."""
    if not (gen := c.bundle.deployed_failure()):
        return None
    active = c.active
    runs = f"running {active.id[:12]}" if active else "no generation is active"
    return Health.DEGRADED, f"generation {gen.id[:12]} ({gen.version}) failed: {gen.failed}; {runs}"


def _for_other_kernel(c: Case) -> Finding | None:
    """The active generation targets another kernel than the running one, so no generation
    of the bundle is for the running kernel and nothing of it is loaded: failed."""
    active = c.active
    if active is None or not c.other_kernel:
        return None
    pending = c.bundle.generations.get(c.bundle.pending) if c.bundle.pending else None
    if pending is not None and pending.kernel == c.kernel:
        then = f"pending {_name(pending)} targets it (loaded at the next boot)"
    else:
        then = f"a drop for {c.kernel} accepted brings it back at the next boot"
    return Health.FAILED, (
        f"no generation for the running kernel {c.kernel}: nothing of it is loaded (the "
        f"active generation {_name(active)} targets kernel {active.kernel}); {then}"
    )


def _boot_found_other_kernel(c: Case) -> Finding | None:
    """``modstage boot`` found no generation for the kernel it ran (``other_kernel``), the
    running kernel unknown here or the active generation's: failed."""
    if c.active is None or c.other_kernel or c.bundle.phase is not Phase.OTHER_KERNEL:
        return None
    return Health.FAILED, f"nothing of it is loaded: {last_note(c.bundle)}"


def _modules_missing(c: Case) -> Finding | None:
    """A module recorded as loaded is not live: failed; upgrading instead while it left
    for a planned upgrade (:func:`~service.status.upgrade.upgrade_of`), failed again once
    that lasts past its bound."""
    missing, _ = c.mismatches
    if not missing:
        return None
    if c.upgrading is not None:
        grade = Health.FAILED if c.upgrading.expired else Health.UPGRADING
        return grade, upgrading_reason(c.upgrading, missing)
    return Health.FAILED, (
        f"generation {str(c.bundle.active)[:12]} is recorded active but module(s) "
        f"{', '.join(missing)} are not loaded in the running kernel"
    )


def _other_build(c: Case) -> Finding | None:
    """Another build of a recorded module is live: degraded."""
    _, differing = c.mismatches
    if not differing:
        return None
    return Health.DEGRADED, f"another build is loaded than recorded: {', '.join(differing)}"


def _boot_not_run(c: Case) -> Finding | None:
    """The kernel's view counts (:attr:`Case.live_judged`), the bundle is active and
    ``modstage boot`` did not run in this boot: degraded."""
    if not c.live_judged or not c.stale_boot or c.bundle.phase is not Phase.ACTIVE:
        return None
    return Health.DEGRADED, (
        f"modstage boot has not run in this boot (state was written in boot "
        f"{c.state_boot_id}, this is {c.boot_id})"
    )


def _devices_undriven(c: Case) -> Finding | None:
    """The bundle is loaded, and of the present PCI devices its modules are for it drives
    none: degraded. A bundle in ``no_device`` (its hardware absent at boot) is not judged."""
    devices, bundle = c.devices, c.bundle
    if devices is None or bundle.phase is not Phase.ACTIVE or not bundle.loaded:
        return None
    if not devices.devices or devices.bound:
        return None
    return Health.DEGRADED, f"its modules drive none of its devices: {devices.summary()}"


def _load_unfinished(c: Case) -> Finding | None:
    """A load started in an earlier boot never finished: degraded."""
    if c.bundle.phase is not Phase.LOADING or not c.stale_boot:
        return None
    return (
        Health.DEGRADED,
        "a load started in an earlier boot never finished; the next boot retries it",
    )


#: Every rule a known bundle is judged by, in the order its reasons are shown.
RULES: tuple[Rule, ...] = (
    _rejected_drop,
    _refused_pod_keeps,
    _load_failed,
    _deployed_failed,
    _for_other_kernel,
    _boot_found_other_kernel,
    _modules_missing,
    _other_build,
    _boot_not_run,
    _devices_undriven,
    _load_unfinished,
)


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
) -> Grade:
    """Judge one bundle from its state and its last status file: each of :data:`RULES`
    that holds is a reason, the worst of their healths the bundle's (healthy: none holds).

    ``live``, ``devices`` and ``unloads`` are optional: without one, the rules that read it
    hold for none. A status file without a bundle (a name no generation has: a typo, or a
    container nobody runs any more) is degraded when it says its drop was rejected.
    """
    if bundle is None:
        if status_doc is None or status_doc.phase != Phase.REJECTED.value:
            return _verdict([], None)
        forget = f"modstage forget {status_doc.bundle} clears it"
        why = f"{_rejected(status_doc)}; no bundle of that name is known: {forget}"
        return _verdict([(Health.DEGRADED, why)], None)
    case = Case(bundle, status_doc, kernel, boot_id, state_boot_id, live, devices, unloads)
    return _verdict([f for rule in RULES if (f := rule(case)) is not None], case.upgrading)


def _verdict(found: list[Finding], upgrading: Upgrading | None) -> Grade:
    worst = max((h for h, _ in found), default=Health.HEALTHY)
    return Grade(worst, tuple(r for _, r in found), upgrading, tuple(h for h, _ in found))


def _rejected(doc: StatusFile) -> str:
    return f"the last drop was rejected: {'; '.join(doc.errors) or 'no reason given'}"


def last_note(bundle: BundleState) -> str | None:
    """The newest note in the bundle's history (why it moved last), if any."""
    return next((h.note for h in reversed(bundle.history) if h.note), None)


def _name(gen: Generation | None) -> str:
    return f"{gen.id[:12]} ({gen.version})" if gen else "-"


def _refusal_note(c: Case) -> str | None:
    """What became of the active generation after the last drop was refused, when its
    modules had left the kernel (see
    :meth:`~service.bundles.state.BundleState.after_refusal`); None when nothing did."""
    bundle, live, active = c.bundle, c.live, c.active
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


def _keeps(active: Generation) -> str:
    """The last known good runs, kept by the refused drop's pod (the digest is its own)."""
    return (
        f"the last good generation {_name(active)} runs, under the refused driver pod's "
        "config digest, until a drop is accepted"
    )


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

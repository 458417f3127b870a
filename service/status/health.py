"""Whether a bundle is healthy, decided from plain values (its state, status file, the kernel).

Nothing here reads or writes a file: :func:`bundle_health` takes what
:mod:`service.status.collect` read and returns a :class:`Verdict`.
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
    """How a bundle (or the host) is doing; the value is ``status``'s exit code."""

    HEALTHY = 0
    DEGRADED = 1
    FAILED = 2

    @property
    def label(self) -> str:
        """The lowercase name used in JSON and tables."""
        return self.name.lower()


@dataclass(frozen=True)
class Verdict:
    """A health and the reasons for it, in plain words."""

    health: Health
    reasons: tuple[str, ...] = ()


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
) -> Verdict:
    """Judge one bundle from its state and its last status file.

    failed: the bundle's last load failed and nothing of it is loaded.
    degraded: a generation newer than the active one failed (the last known
    good runs), the last drop was rejected (and what became of the active generation
    whose modules had left the kernel before it: :func:`_refusal_note`), a refused
    drop's pod keeps the last known good, the active generation targets
    another kernel, or a load started in an earlier boot never finished.
    With ``live`` (the kernel's view of the recorded modules): failed when a
    module recorded as loaded is not live, degraded when another build of it
    is, or when ``modstage boot`` did not run in this boot. With ``devices`` (the present
    PCI devices the loaded modules are for): degraded when it drives none of them.
    A bundle in ``no_device`` (its hardware was absent at boot) is not unhealthy for it.
    """
    found: list[Finding] = []
    if status_doc is not None and status_doc.phase == Phase.REJECTED.value:
        why = "; ".join(status_doc.errors) or "no reason given"
        note = _refusal_note(bundle, live) if bundle is not None else None
        found.append((Health.DEGRADED, f"the last drop was rejected: {why}{note or ''}"))
    elif bundle is not None and (kept := _refused_keeps(bundle)):
        found.append((Health.DEGRADED, kept))
    if bundle is not None:
        found += _failures(bundle)
        found += _kernel_findings(bundle, kernel, live, boot_id, state_boot_id)
        found += _device_findings(bundle, devices)
        if bundle.phase is Phase.LOADING and boot_id and state_boot_id and boot_id != state_boot_id:
            found.append(
                (
                    Health.DEGRADED,
                    "a load started in an earlier boot never finished; the next boot retries it",
                )
            )
    return Verdict(max((h for h, _ in found), default=Health.HEALTHY), tuple(r for _, r in found))


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
) -> list[Finding]:
    """What the running kernel says of the active generation: another kernel, or not live."""
    active = _active(bundle)
    if active is None:
        return []
    if kernel is not None and active.kernel != kernel:
        why = (
            f"the active generation targets kernel {active.kernel}, "
            f"running {kernel}: its modules are not loaded"
        )
        return [(Health.DEGRADED, why)]
    if live is None:
        return []
    return _live_findings(bundle, live, boot_id, state_boot_id)


def _live_findings(
    bundle: BundleState,
    live: Mapping[str, LiveModule | None],
    boot_id: str | None,
    state_boot_id: str | None,
) -> list[Finding]:
    """What the kernel contradicts in the record of the active generation."""
    found: list[Finding] = []
    missing, differing = module_mismatches(bundle.loaded, live)
    gen = str(bundle.active)[:12]
    if missing:
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

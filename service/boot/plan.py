"""What to load at boot, decided from plain values (no I/O).

:func:`choose` picks a bundle's generation for this boot, :func:`order` sorts
bundles so that each loads after the bundles it names in ``after``.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from service.bundles.cover import carried as carried_for
from service.bundles.state import BundleState


@dataclass(frozen=True)
class Choice:
    """What one bundle brings up this boot."""

    bundle: str
    generation: str | None  # to load now (None: nothing to load)
    fallback: str | None = None  # the last known good, if ``generation`` is a new one
    pending: bool = False  # ``generation`` is the pending one (counts an attempt)
    expired: str | None = None  # a pending generation out of attempts: mark it failed
    note: str = ""


def choose(
    name: str, bundle: BundleState, kernel: str, max_attempts: int, floor: str | None = None
) -> Choice:
    """The pending generation if it targets ``kernel``, has attempts left and the bundle is
    not held by an admin, else the active one (the last known good); when neither is for
    ``kernel``, the one carried for it (:func:`service.bundles.cover.carried`: staged for a kernel
    update before a later drop took the pending slot, or the last one of a kernel booted
    back into), unless held, and never one whose version orders below ``floor`` (the
    bundle's ``min_version`` now). A pending generation with no last known good for
    ``kernel`` to fall back to (the active one is built for another kernel, or is the same
    generation dropped again) falls back to the one carried for ``kernel``, so a new
    version that fails at its first boot into a new kernel leaves the older driver built
    for that kernel loaded, not none."""
    choice = _choose(name, bundle, kernel, max_attempts)
    carried = carried_for(bundle, kernel, floor)
    if choice.pending and choice.fallback is None and carried is not None:
        return replace(choice, fallback=carried.id)
    if choice.generation is not None or bundle.held or carried is None:
        return choice
    note = f"carried {carried.id[:12]} ({carried.version}) built for kernel {kernel}"
    return replace(choice, generation=carried.id, note=note)


def _choose(name: str, bundle: BundleState, kernel: str, max_attempts: int) -> Choice:
    """:func:`choose` among the pending and the active generation only."""
    active = bundle.active
    if active is not None and bundle.generations[active].kernel != kernel:
        other = bundle.generations[active].kernel
        active, active_note = None, f"active generation targets kernel {other}"
    else:
        active_note = ""
    pending = bundle.generations.get(bundle.pending) if bundle.pending else None
    if pending is None or pending.failed:
        return Choice(name, active, note=active_note)
    if pending.kernel != kernel:
        note = f"pending generation targets kernel {pending.kernel}, running {kernel}"
        return Choice(name, active, note=note)
    if bundle.held and pending.id != active:
        note = f"held by an admin: pending {pending.id[:12]} waits for modstage release"
        return Choice(name, active, note=note)
    if pending.attempts >= max_attempts:
        reason = f"did not complete boot in {pending.attempts} attempts (max_boot_attempts)"
        return Choice(name, active, expired=reason, note=reason)
    fallback = None if active == pending.id else active  # the active one, dropped again
    return Choice(name, pending.id, fallback=fallback, pending=True)


def order(
    choices: list[Choice], after: dict[str, tuple[str, ...]]
) -> tuple[list[Choice], tuple[str, ...]]:
    """Choices sorted so that every bundle follows those it names in ``after``, and the
    bundles caught in a cycle (they come last, in name order; the loader logs them).

    Names of bundles not present are ignored.
    """
    by_name = {c.bundle: c for c in sorted(choices, key=lambda c: c.bundle)}
    done: list[Choice] = []
    placed: set[str] = set()
    progress = True
    while progress:
        progress = False
        for name, choice in by_name.items():
            deps = [d for d in after.get(name, ()) if d in by_name]
            if name not in placed and all(d in placed for d in deps):
                done.append(choice)
                placed.add(name)
                progress = True
    cycle = tuple(n for n in by_name if n not in placed)
    return done + [by_name[n] for n in cycle], cycle

"""The admin's verbs on a bundle: retry, rollback, hold, release, prune.

Each is a pure transition of a :class:`~service.bundles.state.BundleState`, built on its
records and refused with :class:`StateError` when it cannot apply; the callers
(``service.cmd.admin``) take the state lock, apply one, and save. A retry or rollback
is recorded as the admin's choice (:class:`~service.bundles.records.AdminChoice`) while its
generation is pending: a drop then waits in incoming behind a rollback, and names the
retry it replaces.
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import replace

from service.bundles.phase import Phase
from service.bundles.records import AdminChoice
from service.bundles.state import BundleState, Generation, added, kernels_last
from service.errors import StateError


def resolve(bundle: BundleState, generation: str) -> Generation:
    """The known generation whose id is or starts with ``generation``; raises StateError."""
    found = [g for g in bundle.generations.values() if g.id.startswith(generation.lower())]
    if len(found) != 1 or not generation:
        known = ", ".join(sorted(g[:12] for g in bundle.generations)) or "none"
        what = "is ambiguous" if found else "is not a known generation"
        raise StateError(f"{generation!r} {what} (known: {known})")
    return found[0]


def retry(bundle: BundleState, generation: str | None = None) -> BundleState:
    """Clear a failed generation's failure, or an admin's rollback away from a generation,
    and make it pending for the next boot.

    Without ``generation``: the most recently added failed or rolled-back one.
    """
    if generation is None:
        barred = (g for g in bundle.generations.values() if g.failed or g.rolled_back)
        latest = sorted(barred, key=added)
        if not latest:
            raise StateError("no failed or rolled-back generation to retry")
        gen = latest[-1]
    else:
        gen = resolve(bundle, generation)
    if not gen.failed and not gen.rolled_back:
        raise StateError(
            f"generation {gen.id[:12]} neither failed nor was rolled back; use rollback"
        )
    if gen.id == bundle.active and bundle.active_up:  # rolled back from, the rollback not live
        return cancel(bundle)
    _not_loading(bundle, "retry")
    if bundle.admin_choice is not None and bundle.admin_choice.generation != gen.id:
        bundle = _unretried(bundle)
    cleared = replace(gen, failed=None, attempts=0, rolled_back=None)
    what = f"retry of {gen.id[:12]} ({gen.version})"
    chosen = AdminChoice("retry", gen.id, what, failed=gen.failed, rolled_back=gen.rolled_back)
    return bundle.with_generation(cleared).move(
        Phase.PENDING,
        pending=gen.id,
        chosen=chosen,
        note=f"admin: retry {gen.id[:12]} ({gen.failed or 'rolled back: ' + str(gen.rolled_back)})",
    )


def rollback(bundle: BundleState, generation: str | None = None) -> BundleState:
    """Make an earlier generation the one to load at the next boot.

    Without ``generation``: the newest generation added before the active one
    that did not fail, built for the active one's kernel. The generations it moves away
    from are kept out of later drops until a retry only when built for the same kernel as
    the one chosen: a pending generation for another kernel (a kernel update's driver) is
    displaced, not rolled back from, so a boot into that kernel still carries it.
    """
    gen = _earlier(bundle) if generation is None else resolve(bundle, generation)
    up = bundle.active_up  # not up (its boot could not load it): it is made pending below
    if gen.id == bundle.active and up and bundle.pending not in (None, gen.id):
        return cancel(bundle)
    if gen.id == bundle.active and (up or bundle.pending is None):
        raise StateError(f"generation {gen.id[:12]} is already active")
    if gen.id == bundle.pending:
        raise StateError(
            f"generation {gen.id[:12]} is already pending (the next boot loads it); "
            "nothing recorded again"
        )
    if gen.failed:
        raise StateError(f"generation {gen.id[:12]} failed ({gen.failed}); use retry")
    _not_loading(bundle, "rollback")
    bundle = _unretried(bundle)
    what = f"rollback to {gen.id[:12]} ({gen.version})"
    for away in (g for g in (bundle.active, bundle.pending) if g and g != gen.id):
        if bundle.generations[away].kernel != gen.kernel:
            continue  # another kernel's driver: displaced, still carried for that kernel
        # kept out of later drops until a retry (policy_problems)
        bundle = bundle.with_generation(replace(bundle.generations[away], rolled_back=what))
    return bundle.with_generation(replace(gen, attempts=0)).move(
        Phase.PENDING,
        pending=gen.id,
        chosen=AdminChoice("rollback", gen.id, what),
        note=f"admin: {what}",
    )


def cancel(bundle: BundleState) -> BundleState:
    """Take back a pending generation (a rollback, a retry, a drop): the active one, still
    loaded, stays; the pending one is kept in the store as retained. Refused once the
    daemon asked for the reboot (``reboot_scheduled``), while loading, and when the last
    boot did not bring the active one up (:attr:`BundleState.active_up`: going back to it
    would call a generation active that nothing loaded)."""
    _not_loading(bundle, "cancel")
    if not bundle.active_up:
        raise StateError(
            f"nothing to cancel back to: the active generation {str(bundle.active)[:12]} "
            "did not come up at the last boot"
        )
    if bundle.phase is not Phase.PENDING or bundle.pending is None or bundle.active is None:
        raise StateError(
            f"nothing to cancel in phase {bundle.phase.value} (only a pending generation "
            "with an active one to stay on, before the reboot is asked)"
        )
    note = f"admin: rollback to active {bundle.active[:12]} cancels pending {bundle.pending[:12]}"
    choice = bundle.admin_choice
    if choice is not None and choice.verb == "rollback":  # what it kept out comes back
        for gen in bundle.generations.values():
            if gen.rolled_back == choice.what:
                bundle = bundle.with_generation(replace(gen, rolled_back=None))
    if choice is not None and choice.verb == "retry":  # what it cleared is recorded again
        gen = bundle.generations[choice.generation]
        bundle = bundle.with_generation(
            replace(gen, failed=choice.failed, rolled_back=choice.rolled_back)
        )
        if choice.failed:
            note += f" (still failed: {choice.failed})"
    return bundle.move(Phase.ACTIVE, pending=None, note=note)


def _unretried(bundle: BundleState) -> BundleState:
    """``bundle`` with what an admin's pending retry cleared recorded again (its failure,
    or the rollback away from it): a verb that makes another generation pending takes the
    retry back, as :func:`cancel` does."""
    choice = bundle.admin_choice
    if choice is None or choice.verb != "retry":
        return bundle
    gen = bundle.generations[choice.generation]
    return bundle.with_generation(
        replace(gen, failed=choice.failed, rolled_back=choice.rolled_back)
    )


def _earlier(bundle: BundleState) -> Generation:
    """The newest generation added before the active one that did not fail, built for the
    active one's kernel (one for another kernel could not load where the active one runs)."""
    active = bundle.generations.get(bundle.active) if bundle.active else None
    since = active.added if active is not None else float("inf")
    older = sorted(
        (
            g
            for g in bundle.generations.values()
            if not g.failed and g.id != bundle.active and g.added < since
            if active is None or g.kernel == active.kernel
        ),
        key=added,
    )
    if not older:
        kernel = f" built for kernel {active.kernel}" if active is not None else ""
        raise StateError(f"no earlier generation{kernel} to roll back to")
    return older[-1]


def hold(bundle: BundleState) -> BundleState:
    """Take no new generation and ask for no reboot until :func:`release`."""
    if bundle.held:
        raise StateError("already held")
    return replace(bundle, held=True).record("admin: hold")


def release(bundle: BundleState) -> BundleState:
    """Undo :func:`hold`. A pending generation a boot passed over while held (the boot
    brought the last known good up, so the phase moved on) is pending again: the daemon
    asks the reboot that loads it."""
    if not bundle.held:
        raise StateError("not held")
    released = replace(bundle, held=False)
    gen = bundle.generations.get(bundle.pending) if bundle.pending else None
    passed_over = bundle.phase in (Phase.ACTIVE, Phase.FAILED, Phase.NO_DEVICE)
    if gen is not None and not gen.failed and gen.id != bundle.active and passed_over:
        return released.move(
            Phase.PENDING, note=f"admin: release; generation {gen.id[:12]} pending again"
        )
    return released.record("admin: release")


def prune(
    bundle: BundleState, retain: int, installed: Collection[str] = ()
) -> tuple[BundleState, list[str]]:
    """Forget generations beyond the newest ``retain``; never active (last known good),
    pending, or the newest one of an ``installed`` kernel (what a boot into it loads).
    Returns the copy and the forgotten ids (the caller removes them)."""
    newest = {g.id for g in sorted(bundle.generations.values(), key=added)[-retain:]}
    keep = bundle.keep() | (newest if retain > 0 else set())
    keep |= kernels_last(bundle.generations, installed)
    gone = sorted(g for g in bundle.generations if g not in keep)
    if not gone:
        return bundle, []
    left = {k: v for k, v in bundle.generations.items() if k in keep}
    note = "admin: prune " + ", ".join(g[:12] for g in gone)
    return replace(bundle, generations=left).record(note), gone


def _not_loading(bundle: BundleState, verb: str) -> None:
    if bundle.phase is Phase.LOADING:
        raise StateError(f"cannot {verb} while the bundle is being loaded")

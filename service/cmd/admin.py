"""The admin's verbs: ``generations``, ``retry``, ``rollback``, ``hold``, ``release``, ``prune``.

Every verb that changes something runs under the state lock (so it is safe while the
daemon runs), goes through a named transition of a bundle (:mod:`service.bundles.verbs`)
(recorded in the bundle's history), saves with the one crash-safe write, and rewrites
the bundle's status file so the container sees it. ``generations`` only reads.
Exit codes: 0 done, 1 refused (the message says why), 2 usage.
"""

from __future__ import annotations

import argparse
import contextlib
import json
from collections.abc import Callable
from dataclasses import replace
from typing import Any, TextIO

from service.bundles import verbs
from service.bundles.cover import would_load
from service.bundles.phase import Phase
from service.bundles.state import BundleState, Generation, State
from service.bundles.statefile import locked, save
from service.cmd.host import Host
from service.errors import ServiceError, StateError, UsageError
from service.generations.store import Store
from service.host.installed import installed_releases
from service.host.nextboot import next_kernel
from service.host.running import RunningHost
from service.intake.bundlerules import below_floor
from service.intake.owners import verb_claims
from service.layout import Layout
from service.publish.bundle_status import write_status
from service.publish.operator import mirror_status
from service.status.survey import generation_rows as status_rows
from service.status.survey import read_state
from stager.schema.record import dump
from stager.schema.statusfile import StatusFile, StatusFileError

Change = Callable[[BundleState], BundleState]


def generation_rows(state: State, store: Store, only: str | None) -> list[dict[str, Any]]:
    """One row per known generation (oldest first per bundle): the record ``status --json``
    prints for a generation, with its bundle, whether the store still has it, and the hold."""
    if only is not None and only not in state.bundles:
        raise UsageError(f"no bundle named {only!r} (known: {', '.join(state.bundles) or 'none'})")
    rows = []
    for name, b in sorted(state.bundles.items()):
        if only is not None and name != only:
            continue
        for g in status_rows(b):
            rows.append({"bundle": name, **dump(g), "in_store": store.has(g.id), "held": b.held})
    return rows


def _print_rows(rows: list[dict[str, Any]], out: TextIO) -> None:
    if not rows:
        print("no generations", file=out)
    for r in rows:
        fail = f" failed: {r['failed']}" if r["failed"] else ""
        gone = "" if r["in_store"] else " (not in the store)"
        print(
            f"{r['bundle']} {r['id'][:12]} {r['version']} kernel {r['kernel']} "
            f"added {r['added_utc'] or '-'} attempts {r['attempts']} "
            f"[{','.join(r['roles'])}]{gone}{fail}",
            file=out,
        )


def current(layout: Layout) -> State:
    """The state, read without moving a corrupt file aside (boot rebuilds it); raises
    :class:`StateError` naming the file when it is unreadable or was set aside."""
    aside = sorted(layout.state.parent.glob(f"{layout.state.name}.corrupt-*"))
    if aside and not layout.state.exists():
        raise StateError(
            f"{layout.state} is missing and a corrupt one is set aside at {aside[-1]}: "
            "the next modstage boot rebuilds it from last-good.json and the store"
        )
    return read_state(layout.state)


def change(layout: Layout, name: str, how: Change) -> BundleState:
    """Apply ``how`` to bundle ``name`` under the state lock; save; rewrite its status file."""
    with locked(layout.var):
        state = current(layout)
        if name not in state.bundles:
            raise UsageError(unknown_bundle(layout, state, name))
        before = state.bundles[name]
        try:
            bundle = how(before)
        except StateError as exc:
            raise StateError(f"{name}: {exc}") from exc
        if bundle.pending is not None and bundle.pending != before.pending:
            claims = verb_claims(state, Store(layout.store), name, bundle.pending)
            if claims:
                raise StateError(f"{name}: " + "; ".join(claims))
        state = state.with_bundle(name, bundle)
        save(layout.state, state, step="admin")
        write_status(layout, name, bundle)
        _withdraw(layout, state)
        _publish(layout)
    return bundle


def _withdraw(layout: Layout, state: State) -> None:
    """Withdraw the daemon's reboot request of this boot once an admin's verb left nothing
    waiting for it (a hold, a cancelled pending generation, a forgotten bundle): the intent
    is cleared and kured's sentinel, if modstage wrote it, removed, so no reboot comes for
    nothing. The daemon asks again once something waits."""
    from service.logs import get_logger

    running = RunningHost.read(layout)
    if running.boot_id is None or running.release is None:
        return  # status says what cannot be read
    waiting = state.awaiting_reboot(running.release)
    intent = state.intent_in(running.boot_id)
    if intent is None or waiting:
        return
    save(layout.state, replace(state, reboot=None), step="admin")
    with contextlib.suppress(ServiceError):  # an invalid config: status says why
        Host(layout).rebooter.clear()
    get_logger("modstage.admin").info(
        "reboot.withdrawn", asked_at=intent.at, bundles=list(intent.bundles)
    )


def unknown_bundle(layout: Layout, state: State, name: str) -> str:
    """The error for a verb on a bundle ``state`` does not know; when a rejected drop's
    status file is all there is of it, the error names the verb that clears it (``forget``)."""
    known = ", ".join(sorted(state.bundles)) or "none"
    message = f"no bundle named {name!r} in {layout.state} (known: {known})"
    status = layout.status / f"{name}.json"
    try:
        doc = StatusFile.read(status)
    except StatusFileError:
        doc = None  # a garbled one: status names it
    if doc is not None and doc.phase == Phase.REJECTED.value:
        message += f"; only its rejected drop is recorded ({status}): modstage forget {name}"
        message += " clears it"
    return message


def _publish(layout: Layout) -> None:
    """Show an admin's change where the cluster reads it (status copies, node labels)."""
    try:
        config = Host(layout).config
    except ServiceError:
        return  # an invalid config: the daemon refuses to run, status says why
    mirror_status(layout, config)


def _report(
    bundle: str,
    b: BundleState,
    what: str,
    args: argparse.Namespace,
    out: TextIO,
    running: str | None = None,
    upcoming: tuple[str, Generation | None] | None = None,
) -> None:
    """What a verb did, as ``--json`` or one line; a pending generation built for another
    kernel than the ``running`` one is said to load at the next boot into its kernel, and
    one built for another kernel than the next boot runs (``upcoming``: that kernel, when
    known, and what a boot into it brings up of the bundle) says so."""
    if args.json:
        gen = b.generations.get(b.pending) if b.pending else None
        doc = {
            "bundle": bundle,
            "done": what,
            "phase": b.phase.value,
            "active": b.active,
            "pending": b.pending,
            "held": b.held,
            "pending_kernel": gen.kernel if gen is not None else None,
            "running_kernel": running,
            "next_kernel": upcoming[0] if upcoming else None,
            "next_boot_brings": upcoming[1].id if upcoming and upcoming[1] else None,
        }
        print(json.dumps(doc, indent=2, sort_keys=True), file=out)
    else:
        gen = b.generations.get(b.pending) if b.pending else None
        boot = "the next boot"
        if gen is not None and running is not None and gen.kernel != running:
            boot += f" into kernel {gen.kernel} (running {running})"
        when = "waits for release while held" if b.held else f"loads at {boot}"
        if gen is not None and not b.held and upcoming and gen.kernel != upcoming[0]:
            brings = upcoming[1]
            what_then = f"{brings.id[:12]} ({brings.version})" if brings else "nothing of it"
            when = (
                f"loads at a boot into kernel {gen.kernel}; the next boot runs kernel "
                f"{upcoming[0]} and brings up {what_then}"
            )
        pending = f", pending {b.pending[:12]} ({when})" if b.pending else ""
        if b.held:
            pending += "; the last known good loads at boot, new drops wait in incoming"
        print(f"{bundle}: {what}; phase {b.phase.value}{pending}", file=out)


def run(args: argparse.Namespace, out: TextIO) -> int:
    """Dispatch one verb (``args.command``, its name in :data:`service.parser.VERBS`)."""
    layout = Layout(args.root)
    verb = args.command
    if verb == "generations":
        rows = generation_rows(current(layout), Store(layout.store), args.bundle)
        if args.json:
            print(json.dumps(rows, indent=2, sort_keys=True), file=out)
        else:
            _print_rows(rows, out)
        return 0
    if verb == "prune":
        return prune(layout, args, out)
    if verb == "forget":
        return forget(layout, args, out)
    gen = getattr(args, "generation", None)
    transitions: dict[str, Change] = {
        "retry": lambda b: verbs.retry(b, gen),
        "rollback": lambda b: verbs.rollback(b, gen),
        "hold": verbs.hold,
        "release": verbs.release,
    }
    step = transitions[verb]

    def how(b: BundleState) -> BundleState:
        moved = step(b)
        kept = moved.pending is None or Store(layout.store).has(moved.pending)  # None: cancelled
        if verb in ("retry", "rollback") and not kept:
            raise StateError(
                f"generation {str(moved.pending)[:12]} is no longer in the store; stage it again"
            )
        if verb in ("retry", "rollback"):
            _refuse_uninstalled(layout, moved)
        return moved

    b = change(layout, args.bundle, how)
    what = {"retry": "retry recorded", "rollback": "rollback recorded"}.get(verb, f"{verb} done")
    if verb == "rollback" and b.pending is None:
        what = "pending generation cancelled (rollback to the active one)"
    elif verb == "rollback" and (chosen := b.generations.get(str(b.pending))) is not None:
        what += _below_floor(layout, args.bundle, chosen.version)
    if verb == "retry" and b.pending is None:
        what = "pending rollback cancelled (retry of the active generation)"
    running = RunningHost.read(layout).release  # None: status says what cannot be read
    _report(args.bundle, b, what, args, out, running, _next_boot(layout, args.bundle, b))
    return 0


def _next_boot(
    layout: Layout, name: str, bundle: BundleState
) -> tuple[str, Generation | None] | None:
    """The kernel the next boot runs and what a boot into it brings up of ``bundle`` (its
    ``min_version`` and the attempts counted as boot counts them); None when unknown. The
    config is read as boot reads it."""
    config = Host(layout, salvage=True).config
    if (upcoming := next_kernel(layout, config.kernel.next).release) is None:
        return None
    floor = config.bundle_policy(name).min_version
    return upcoming, would_load(bundle, upcoming, floor, config.max_boot_attempts)


def _refuse_uninstalled(layout: Layout, bundle: BundleState) -> None:
    """Refuse to make pending a generation built for a kernel that is not installed: no
    boot could load it. Nothing is refused when no installed kernel can be read."""
    gen = bundle.generations.get(bundle.pending) if bundle.pending else None
    kernels = installed_releases(layout)
    if gen is None or not kernels or gen.kernel in kernels:
        return
    raise StateError(
        f"generation {gen.id[:12]} is built for kernel {gen.kernel}, which is not installed "
        f"on this host (installed: {', '.join(sorted(kernels))}): no boot could load it"
    )


def _below_floor(layout: Layout, bundle: str, version: str) -> str:
    """What a rollback's note adds when the version it chose is below the bundle's
    ``min_version`` (nothing otherwise): the floor keeps drops out, never the admin. The
    config is read as boot reads it, so a broken one does not fail the recorded rollback."""
    config = Host(layout, salvage=True).config
    why = below_floor(version, bundle, config.bundle_policy(bundle))
    return "" if why is None else f"; {why}: a drop of it would be refused, the rollback is not"


def prune(layout: Layout, args: argparse.Namespace, out: TextIO) -> int:
    """Forget and remove generations beyond retention (never active, pending or the newest
    for an installed kernel)."""
    keep = args.keep if args.keep is not None else Host(layout).config.retain
    if keep < 0:
        raise UsageError("--keep must be 0 or more")
    removed: dict[str, list[str]] = {}
    kernels = installed_releases(layout)
    with locked(layout.var):
        state = current(layout)
        for name, b in sorted(state.bundles.items()):
            pruned, gone = verbs.prune(b, keep, kernels)
            if gone:
                state = state.with_bundle(name, pruned)
                removed[name] = gone
        if removed:
            save(layout.state, state, step="admin")  # state first: no dangling id after a crash
            Store(layout.store).collect(g for gone in removed.values() for g in gone)
            for name in removed:
                write_status(layout, name, state.bundles[name])
            _publish(layout)
    if args.json:
        print(json.dumps({"removed": removed, "keep": keep}, indent=2, sort_keys=True), file=out)
    else:
        for name, gone in removed.items():
            print(f"{name}: removed {', '.join(g[:12] for g in gone)}", file=out)
        if not removed:
            print(
                f"nothing to prune (keeping {keep} per bundle plus active, pending and the "
                "newest for each installed kernel)",
                file=out,
            )
    return 0


def forget(layout: Layout, args: argparse.Namespace, out: TextIO) -> int:
    """Forget a bundle with nothing active (nothing of it was ever loaded; a pending
    generation goes with it): its state (and the generations only it names, from the
    store) and its status files, so a typo'd or hostile name, rejected or pending, no longer
    keeps the host degraded nor claims another bundle's modules. Its history goes with it:
    the note is in the journal (``admin.forget``) and on stdout."""
    from service.logs import get_logger

    name = args.bundle
    with locked(layout.var):
        state = current(layout)
        status = layout.status / f"{name}.json"
        b = state.bundles.get(name)
        if b is None and not status.exists():
            known = ", ".join(sorted(state.bundles)) or "none"
            raise UsageError(
                f"no bundle named {name!r} in {layout.state} nor a status file (known: {known})"
            )
        if b is not None and b.active:
            raise StateError(
                f"{name}: generation {b.active[:12]} is active (the last known good, loaded "
                "at every boot); forget takes only a bundle with nothing active"
            )
        if b is not None and b.phase is Phase.LOADING:
            raise StateError(f"{name}: cannot forget while the bundle is being loaded")
        gone = sorted(b.generations) if b is not None else []
        if b is not None:
            state = replace(state, bundles={k: v for k, v in state.bundles.items() if k != name})
            save(layout.state, state, step="admin")
            Store(layout.store).collect(gone)
            _withdraw(layout, state)
        status.unlink(missing_ok=True)
        _unpublish(layout, name)
        _publish(layout)
    note = f"admin: forget {name} (its status file, {len(gone)} generation(s))"
    get_logger("modstage.admin").warning("admin.forget", bundle=name, generations=gone, note=note)
    if args.json:
        doc = {"bundle": name, "done": "forgotten", "generations": gone}
        print(json.dumps(doc, indent=2, sort_keys=True), file=out)
    else:
        print(f"{name}: forgotten; {note}", file=out)
    return 0


def _unpublish(layout: Layout, name: str) -> None:
    """Remove the bundle's status copies from the configured status directories."""
    try:
        config = Host(layout).config
    except ServiceError:
        return
    for directory in config.publish.status_dirs:
        (layout.host(directory) / f"{name}.json").unlink(missing_ok=True)

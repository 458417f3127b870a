"""Rebuild a minimal state when ``state.json`` is corrupt, so a boot never loads less.

``statefile.save`` keeps ``last-good.json`` beside ``state.json``: each bundle's last
known good generation. When ``state.json`` cannot be read (it is moved aside by
:func:`service.bundles.statefile.load`), :func:`load_or_rebuild` rebuilds a state from that
pointer and the store: each pointed-to generation still in the store becomes the
bundle's active one, every other stored generation of the bundle is remembered as
retained (an admin may roll back to it). The corrupt file stays set aside for an
admin to inspect; ``status`` reports it until it is removed.
"""

from __future__ import annotations

import time
from pathlib import Path

from service.bundles.phase import Phase
from service.bundles.records import HistoryEntry
from service.bundles.state import BundleState, Generation, State
from service.bundles.statefile import LAST_GOOD, load, read_last_good, save
from service.errors import StateCorrupt
from service.generations.store import Store
from service.logs import get_logger
from stager.schema.failures import ManifestError
from stager.schema.manifest import Manifest

log = get_logger("modstage.state")


def stored(store: Store) -> dict[str, Manifest]:
    """Every readable published generation's manifest, by id."""
    found: dict[str, Manifest] = {}
    for path in sorted(store.root.iterdir()) if store.root.is_dir() else ():
        if path.name.startswith(".") or not store.has(path.name):
            continue
        try:
            found[path.name] = store.manifest(path.name)
        except (OSError, ManifestError) as exc:
            log.error("store.unreadable", generation=path.name, error=str(exc))
    return found


def rebuild(
    pointer: dict[str, dict[str, object]], store: Store, why: str, boot_id: str | None = None
) -> State:
    """A state holding each bundle's stored generations, the pointed-to one active, and
    ``boot_id`` as the boot that ran (the corrupt file's is lost; the caller knows it)."""
    bundles: dict[str, BundleState] = {}
    at = round(time.time(), 3)
    for gid, m in stored(store).items():
        b = bundles.get(m.bundle, BundleState())
        gen = Generation(gid, m.version, m.kernel, added=_mtime(store, gid))
        bundles[m.bundle] = b.with_generation(gen)
    for name, b in list(bundles.items()):
        good = pointer.get(name, {}).get("generation")
        active = good if isinstance(good, str) and good in b.generations else None
        note = f"rebuilt from the store: {why}"
        if active is None:
            note += "; no last known good generation: choose one with modstage rollback"
        phase = Phase.ACTIVE if active else Phase.NONE
        entry = HistoryEntry(at, Phase.NONE.value, phase.value, note)
        bundles[name] = BundleState(
            phase=phase, active=active, generations=b.generations, history=(entry,)
        )
    return State(bundles=bundles, boot_id=boot_id)


def _mtime(store: Store, generation: str) -> float:
    try:
        return store.path(generation).stat().st_mtime
    except OSError:
        return 0.0


def load_or_rebuild(
    path: Path, store: Store, *, durable: bool = True, boot_id: str | None = None
) -> State:
    """``state.load``, or on a corrupt state a state rebuilt from the pointer and the store.

    Boot calls it (the caller holds the state lock), and so does the daemon when a step
    found the state corrupt. The rebuilt state is saved at once, so later boots and the
    daemon start from it and the boot unit never finds state.json missing.
    ``durable=False`` (``boot --dry-run``) decides the same and writes nothing: the
    corrupt file is not moved aside, the rebuilt state not saved. ``boot_id``: the boot
    known to have run in this boot (the daemon's, from :mod:`service.boot.once`), kept in
    the rebuilt state; the boot records its own with its first attempt.
    """
    try:
        return load(path, set_aside=durable)
    except StateCorrupt as exc:
        where = "is set aside at" if exc.moved else "would be set aside at"
        why = f"state.json was corrupt and {where} {exc.aside}"
        pointer = read_last_good(path.with_name(LAST_GOOD))
        state = rebuild(pointer, store, why, boot_id)
        log.error(
            "state.rebuilt",
            path=str(path),
            aside=exc.aside,
            reason=str(exc),
            bundles={n: b.active for n, b in state.bundles.items()},
        )
        if durable:
            save(path, state, step="rebuilt")
        return state

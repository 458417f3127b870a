"""``state.json`` on disk: its JSON form, the crash-safe save, the lock, the last-good pointer.

The records and their transitions are in :mod:`service.bundles.state`; this module
is the file's edge: every field is type-checked on read (:func:`decode`), a state saved
by an earlier version is brought up to date once, there (:func:`migrated`), every
write goes through the one crash-safe write (:func:`save`), and a corrupt file
is set aside, never reset (:func:`load`).
"""

from __future__ import annotations

import fcntl
import json
import os
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import replace
from pathlib import Path
from typing import Any

from service import faults
from service.bundles.state import FORMAT, BundleState, State, added
from service.errors import StateCorrupt, StateError
from stager.schema import record
from stager.schema.atomic import fsync_dir, write_atomic

LAST_GOOD = "last-good.json"  # beside state.json: each bundle's last known good generation


def encode(state: State) -> bytes:
    """The persisted form of ``state``."""
    doc = {"format": FORMAT, **record.dump(state)}
    return json.dumps(doc, indent=1, sort_keys=True).encode() + b"\n"


def decode(raw: bytes) -> State:
    """Parse the persisted form; raises :class:`StateError` on anything unexpected.

    Every field is type-checked here (:func:`stager.schema.record.load`), so that a hand-edited
    or damaged file is refused on read rather than failing later, half-way through a boot;
    a state saved before a field existed is brought up to date here (:func:`migrated`).
    """
    try:
        doc = json.loads(raw)
    except (ValueError, RecursionError) as exc:
        raise StateError(f"state file is corrupt: {exc!r}") from exc
    if not isinstance(doc, dict):
        raise StateError("state is not a JSON object")
    if (form := doc.pop("format", None)) != FORMAT:
        raise StateError(f"unknown state format {form!r}")
    try:
        state = record.load(State, doc)
    except record.RecordError as exc:
        raise StateError(f"state file is corrupt: {exc}") from exc
    for name, bundle in state.bundles.items():
        where = f"bundles.{name}"
        for key, gen in bundle.generations.items():
            if gen.id != key or gen.attempts < 0:
                why = f"{where}.generations.{key} is inconsistent"
                raise StateError(f"state file is corrupt: {why}")
        if any(g not in bundle.generations for g in bundle.keep()):
            raise StateError(f"state file is corrupt: {where} names an unknown generation")
    return replace(state, bundles={n: migrated(b) for n, b in state.bundles.items()})


def migrated(bundle: BundleState) -> BundleState:
    """``bundle`` as read from a state saved before ``deployed`` was recorded: the newest
    generation that failed at boot since the active one was added is ``deployed`` (its
    driver pod is the one still deployed, so its digest is published and its failure
    shown); without such a failure the bundle is returned as it is (the active one's
    digest is published).

    A bundle that records ``deployed`` is returned as it is, and the transitions never
    leave such a failure without recording ``deployed``, so reading a file again changes
    nothing; the next save persists the migrated value.
    """
    if bundle.deployed is not None:
        return bundle
    since = bundle.generations[bundle.active].added if bundle.active else float("-inf")
    failed = [
        g
        for g in bundle.generations.values()
        if g.failed and g.added >= since and g.id != bundle.active
    ]
    if not failed:
        return bundle
    return replace(bundle, deployed=max(failed, key=added).id)


def read(path: Path) -> State:
    """Parse ``path`` without touching it (missing: empty); raises :class:`StateError`."""
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        return State()
    except (IsADirectoryError, NotADirectoryError) as exc:  # planted or mistaken: not a file
        raise StateError(f"{path}: cannot read: {exc.strerror} (not a regular file)") from exc
    try:
        return decode(raw)
    except StateError as exc:
        raise StateError(f"{path}: {exc}") from exc


def load(path: Path, *, set_aside: bool = True) -> State:
    """Read ``path``; a missing file is an empty state, unless a corrupt one was set aside.

    A corrupt file is renamed to ``state.json.corrupt-<time>`` and
    :class:`StateCorrupt` is raised naming both paths. Until an admin removes the
    set-aside file, every later load raises too: modstage never silently forgets
    which generation was good. ``set_aside=False`` (a dry run) raises the same and
    renames nothing: the error names the path the file would be moved to.
    """
    if not path.exists():
        aside = sorted(path.parent.glob(f"{path.name}.corrupt-*"))
        if aside:
            raise StateCorrupt(
                path,
                aside[-1],
                "an earlier state file was corrupt; inspect it, restore it "
                "as state.json or remove it to start afresh",
            )
    try:
        return read(path)
    except StateError as exc:
        aside_path = path.with_name(f"{path.name}.corrupt-{time.time_ns()}")
        if set_aside:
            path.rename(aside_path)
            fsync_dir(path.parent)
        reason = str(exc).removeprefix(f"{path}: ")
        raise StateCorrupt(path, aside_path, reason, moved=set_aside) from exc


def save(path: Path, state: State, *, step: str = "state") -> None:
    """Persist ``state`` with the one crash-safe write.

    ``step`` names the transition (a phase, or ``boot_id``) for the fault points
    ``state.<step>.renaming`` and ``state.<step>.saved``.
    """
    path.parent.mkdir(parents=True, exist_ok=True)
    write_atomic(
        path,
        encode(state),
        mode=0o600,
        before_replace=lambda: faults.hit(f"state.{step}.renaming"),
    )
    faults.hit(f"state.{step}.saved")
    _point_last_good(path.with_name(LAST_GOOD), state)


def read_last_good(path: Path) -> dict[str, dict[str, Any]]:
    """The last-good pointer file (``{bundle: {generation, version, kernel}}``); {} if unusable."""
    try:
        doc = json.loads(path.read_bytes())
    except (OSError, ValueError):
        return {}
    if not isinstance(doc, dict):
        return {}
    return {
        k: v for k, v in doc.items() if isinstance(v, dict) and isinstance(v.get("generation"), str)
    }


def _point_last_good(path: Path, state: State) -> None:
    """Keep the last-good pointer beside state (written only when it changes).

    It survives a corrupt ``state.json``: boot rebuilds from it and the store.
    Bundles without an active generation keep what the pointer said.
    """
    old = read_last_good(path)
    new = dict(old)
    for name, b in state.bundles.items():
        gen = b.generations.get(b.active) if b.active else None
        if gen is not None:
            new[name] = {"generation": gen.id, "version": gen.version, "kernel": gen.kernel}
    if new != old:
        write_atomic(path, json.dumps(new, indent=1, sort_keys=True).encode() + b"\n", mode=0o600)


@contextmanager
def locked(directory: Path) -> Iterator[None]:
    """Hold modstage's state lock (one writer of state.json at a time, across processes)."""
    directory.mkdir(parents=True, exist_ok=True)
    fd = os.open(directory / ".lock", os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)

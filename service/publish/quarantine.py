"""The quarantine: rejected drops kept (bounded) for an admin to inspect.

A rejected drop is moved, by one rename, from ``incoming/`` to
``quarantine/<drop name>/`` (root only, out of the container's reach), beside a
record ``quarantine/<drop name>.json`` saying which bundle it claimed, the kernel its
manifest targets (when it was read) and why it was refused (:func:`refused_at` gives the
next kernel's cover its ``refused``). Only the newest ``limits.quarantine_drops`` drops
are kept, holding at most ``limits.quarantine_bytes`` together: older ones go first; a drop that
cannot be measured (too deep, too many entries) keeps its record but loses its
contents at once.

A drop that can be neither moved here nor removed (a mount point, a directory on
another file system that refuses removal) is recorded as *left in place*: intake
skips it from then on, so it is handled once, not on every rescan.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from service import faults
from service.config import Limits
from service.dropfs import RemoveError, Tick, copy_tree, remove_tree, tree_size
from service.layout import Layout
from service.logs import get_logger
from stager.schema.atomic import write_atomic
from stager.schema.paths import parse_drop_name
from stager.schema.record import RecordError, dump, is_none, load, spec
from stager.schema.shown import bounded, shown

log = get_logger("modstage.quarantine")
RECORD = ".json"


@dataclass(frozen=True)
class Record:
    """One quarantined drop: what it claimed, why it was refused, where it is now."""

    drop: str
    bundle: str | None
    reasons: tuple[str, ...]
    at: float
    kept: bool  # its contents are under quarantine/<drop>
    left: str | None = None  # where it stays when it could be neither moved nor removed
    size: int = 0  # bytes its kept contents take
    # the kernel its manifest targets (absent: the manifest was not read)
    kernel: str | None = field(default=None, metadata=spec(omit=is_none))

    def to_dict(self) -> dict[str, Any]:
        """The record as ``status --json`` and the record file show it."""
        return dump(self)

    @classmethod
    def from_dict(cls, doc: Any) -> Record:
        """Read a record file's table (written by :func:`put`); raises ValueError."""
        try:
            return load(cls, doc, unknown="ignore")
        except RecordError as exc:
            raise ValueError(f"not a quarantine record: {exc}") from exc


def put(
    layout: Layout,
    drop: Path,
    bundle: str | None,
    reasons: list[str] | tuple[str, ...],
    limits: Limits,
    tick: Tick | None = None,
    kernel: str | None = None,
) -> Record:
    """Move ``drop`` into the quarantine (or remove it, or leave it), record why (and the
    ``kernel`` its manifest targets, when it was read), prune.

    Never raises for what the drop is; an ``OSError`` of the quarantine itself (a full
    disk) is logged and the drop is removed instead, as before there was a quarantine.
    """
    where = layout.quarantine
    kept, left = False, None
    try:
        where.mkdir(mode=0o700, parents=True, exist_ok=True)
        os.rename(drop, where / drop.name)
        kept = True
        faults.hit("quarantine.moved")
    except OSError as exc:
        if exc.errno == errno.EXDEV:  # an incoming directory on another file system (tmpfs)
            kept = _copy(where, drop, limits, tick)
        else:
            log.warning("quarantine.move_failed", drop=drop.name, error=shown(exc))
        left = _remove_or_leave(drop, limits, tick)
    size = 0
    if kept:
        measured = tree_size(where, drop.name, max_entries=limits.max_tree_entries)
        size = measured if measured is not None else limits.quarantine_bytes + 1
    why = tuple(bounded(list(reasons)))
    record = Record(drop.name, bundle, why, time.time(), kept, left, size, kernel)
    try:
        prune(layout, limits, tick, adding=record)
    except OSError as exc:
        log.error("quarantine.unwritable", drop=drop.name, error=shown(exc))
    log.info("drop.quarantined", drop=drop.name, kept=kept, left=left)
    return record


def _copy(where: Path, drop: Path, limits: Limits, tick: Tick | None) -> bool:
    """Copy a drop that cannot be renamed here; a copy past the bounds is removed again."""
    if os.path.lexists(where / drop.name):
        return False  # never touch what is already in the quarantine under that name
    copied = copy_tree(
        drop.parent,
        drop.name,
        where / drop.name,
        max_entries=limits.max_tree_entries,
        max_bytes=limits.quarantine_bytes,
    )
    if copied is not None:
        return True
    log.warning("quarantine.copy_failed", drop=drop.name, why="over a bound or unreadable")
    _remove_or_leave(where / drop.name, limits, tick)
    return False


def _remove_or_leave(drop: Path, limits: Limits, tick: Tick | None) -> str | None:
    """Remove ``drop``; if even that fails, say where it stays."""
    try:
        remove_tree(drop.parent, drop.name, max_entries=limits.max_tree_entries, tick=tick)
    except RemoveError as exc:
        log.error("drop.unremovable", drop=drop.name, error=shown(exc))
        return str(drop)
    return None


def records(layout: Layout) -> list[Record]:
    """Every readable record, oldest first."""
    out = []
    try:
        names = [n for n in os.listdir(layout.quarantine) if n.endswith(RECORD)]
    except OSError:
        return []
    for name in names:
        try:
            raw = (layout.quarantine / name).read_bytes()
            out.append(Record.from_dict(json.loads(raw)))
        except (OSError, ValueError, AttributeError):
            continue
    return sorted(out, key=lambda r: r.at)


def left_in_place(layout: Layout, drop: Path) -> bool:
    """Whether ``drop`` was recorded as impossible to move or remove (intake skips it)."""
    path = layout.quarantine / f"{drop.name}{RECORD}"
    try:
        record = Record.from_dict(json.loads(path.read_bytes()))
    except (OSError, ValueError, AttributeError):
        return False
    return record.left == str(drop)


def prune(
    layout: Layout, limits: Limits, tick: Tick | None = None, *, adding: Record | None = None
) -> None:
    """Keep the newest ``quarantine_drops`` records, their drops within the byte limit.

    ``adding`` is a drop just moved here: room is made for it before its record is
    written, so the bounds hold at every moment. Sizes come from the records (each
    drop is measured once, when it arrives).
    """
    kept = records(layout)
    _orphans(layout, {r.drop for r in kept}, limits, tick, adding.drop if adding else None)
    if adding is not None:
        kept.append(adding)
    for old in kept[: max(0, len(kept) - limits.quarantine_drops)]:
        if old is not adding:
            _forget(layout, old, limits, tick, record_too=True)
    budget = limits.quarantine_bytes
    for record in reversed(kept[-limits.quarantine_drops :]):
        if record.kept and record.size <= budget:
            budget -= record.size
        elif record.kept:
            _forget(layout, record, limits, tick, record_too=False)
            continue
        if record is adding:
            _write(layout, record)


def _forget(
    layout: Layout, record: Record, limits: Limits, tick: Tick | None, *, record_too: bool
) -> None:
    """Remove a quarantined drop's contents; its record too, or rewrite it as not kept."""
    if parse_drop_name(record.drop) is None:
        return  # a record not written by put(): leave it to the admin
    try:
        remove_tree(layout.quarantine, record.drop, max_entries=limits.max_tree_entries, tick=tick)
    except RemoveError as exc:
        log.error("quarantine.unremovable", drop=record.drop, error=shown(exc))
        if not record_too:
            _write(layout, record)  # kept as it is: the record must exist
        return
    if record_too:
        with contextlib.suppress(FileNotFoundError):
            (layout.quarantine / f"{record.drop}{RECORD}").unlink()
    else:
        why = "contents removed: over the quarantine's size limit"
        _write(layout, replace(record, kept=False, size=0, reasons=(*record.reasons, why)))


def _write(layout: Layout, record: Record) -> None:
    write_atomic(
        layout.quarantine / f"{record.drop}{RECORD}", json.dumps(record.to_dict()).encode()
    )


def _orphans(
    layout: Layout, recorded: set[str], limits: Limits, tick: Tick | None, adding: str | None
) -> None:
    """Remove drops moved here whose record was never written (a kill in between)."""
    for name in os.listdir(layout.quarantine):
        if parse_drop_name(name) and name not in recorded and name != adding:
            with contextlib.suppress(RemoveError):
                remove_tree(layout.quarantine, name, max_entries=limits.max_tree_entries, tick=tick)


def refused_at(found: list[Record], bundle: str, kernel: str) -> float | None:
    """When the newest drop of ``bundle`` for ``kernel`` among the records ``found``
    (:func:`records`) was refused; None: none is recorded."""
    return max((r.at for r in found if r.bundle == bundle and r.kernel == kernel), default=None)

"""The drops in the incoming directories: which are complete, and disposing of them.

A newer drop of a bundle supersedes the older ones for the same kernel in the same incoming
directory (a drop for another kernel covers that kernel and stays, as does one another
writer's directory holds: :meth:`Drops.complete`).

A drop taken in or superseded goes to the trash by one rename (emptied after the
scan, so a huge tree delays no other drop); a rejected one to the quarantine. A drop
that can be neither moved nor removed (a read-only mount, a mount point) is *stuck*:
it is remembered, logged once, shown in its bundle's status file, and skipped by
every later scan of this process, never taken in again and again. The quarantine
also records it as left in place, so a later process skips it too while that record
exists.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from service import faults
from service.beneath import DIR_FLAGS
from service.bundles.statefile import load
from service.config import Config
from service.dropfs import manifest_kernel, remove_tree
from service.errors import ServiceError
from service.layout import Layout
from service.logs import get_logger
from service.publish import quarantine
from service.publish.bundle_status import write_status
from service.publish.operator import incoming_dirs
from stager.schema.paths import MANIFEST_NAME, parse_drop_name
from stager.schema.shown import MAX_REASON, shown

log = get_logger("modstage.intake")
MAX_READ = 64  # manifests read per scan to tell each drop's kernel: a flood costs no more


@dataclass
class Drops:
    """Finds and disposes of drops; ``stuck`` (drop path -> why) outlives one scan."""

    layout: Layout
    config: Config
    tick: Callable[[], None] = field(default=lambda: None)
    stuck: dict[str, str] = field(default_factory=dict)

    def skipped(self, drop: Path) -> bool:
        """Whether ``drop`` is one that cannot be removed (remembered, or recorded)."""
        return str(drop) in self.stuck or quarantine.left_in_place(self.layout, drop)

    def complete(self) -> list[Path]:
        """The newest complete drop of each bundle for each kernel; older ones are removed.

        A drop's kernel is its manifest's, read as intake reads it
        (:func:`~service.dropfs.manifest_kernel`), at most :data:`MAX_READ` manifests
        a scan. A drop whose manifest cannot be read, or is past that bound, names no
        kernel: a newer drop of its bundle supersedes it, and it supersedes none. Drops are
        gathered from every configured incoming directory, and a drop supersedes only drops
        in its own directory: another directory has another writer (the operator's driver
        pod, an admin), whose drop a name with a later time must not remove unjudged. The
        bundles come smallest manifest first (a huge one delays no other bundle), each
        bundle's drops oldest first, so the one staged last is also taken in last.
        """
        found: dict[tuple[str, Path], list[tuple[str, Path]]] = {}
        for entry in self._entries():
            named = parse_drop_name(entry.name)
            if named is None or not os.path.lexists(entry / MANIFEST_NAME):
                continue
            if self.skipped(entry):
                continue
            found.setdefault((named[0], entry.parent), []).append((named[1], entry))
        budget = MAX_READ
        kept: dict[str, list[tuple[str, Path]]] = {}
        for bundle, directory in sorted(found):
            newest: dict[str | None, tuple[str, Path]] = {}
            for key, entry in sorted(found[bundle, directory], reverse=True):
                kernel = manifest_kernel(entry, self.config.limits) if budget > 0 else None
                budget -= 1
                if kernel in newest or (kernel is None and newest):
                    self.remove(entry, "superseded")
                else:
                    newest[kernel] = (key, entry)
            kept.setdefault(bundle, []).extend(newest.values())
        ordered = [[entry for _key, entry in sorted(drops)] for drops in kept.values()]
        ordered.sort(key=lambda drops: min(_manifest_size(d) for d in drops))
        return [drop for drops in ordered for drop in drops]

    def _entries(self) -> list[Path]:
        entries: list[Path] = []
        for directory in incoming_dirs(self.layout, self.config):
            try:
                entries += list(directory.iterdir())
            except FileNotFoundError:
                continue
        return entries

    def remove(self, drop: Path, why: str) -> None:
        """Dispose of a drop taken in or superseded: into the trash by one rename.

        Where the rename cannot be done (another file system) the drop is removed at
        once; one that resists goes to the quarantine, and if it stays, it is stuck.
        """
        try:
            _unlink_manifest(drop)
            faults.hit("drop.removing")
            self.layout.trash.mkdir(mode=0o700, exist_ok=True)
            try:
                os.rename(drop, self.layout.trash / drop.name)
            except OSError:
                remove_tree(
                    drop.parent,
                    drop.name,
                    max_entries=self.config.limits.max_tree_entries,
                    tick=self.tick,
                )
        except OSError as exc:
            reason = f"could not be removed after it was {why}: {exc}"
            self.quarantine(drop, None, [reason])
            return
        log.debug("drop.removed", drop=drop.name, why=why)

    def quarantine(
        self, drop: Path, bundle: str | None, reasons: list[str], kernel: str | None = None
    ) -> None:
        """Move ``drop`` (built for ``kernel``, when its manifest was read) to the
        quarantine; one that stays where it is becomes stuck."""
        limits = self.config.limits
        record = quarantine.put(self.layout, drop, bundle, reasons, limits, self.tick, kernel)
        if record.left is not None:
            self._stuck(drop, reasons[0] if reasons else "could not be removed")

    def _stuck(self, drop: Path, reason: str) -> None:
        """Remember a drop that cannot be removed: log once, say so in its status file."""
        if str(drop) in self.stuck:
            return
        why = shown(f"{drop} stays in place and is skipped from now on: {reason}", MAX_REASON)
        self.stuck[str(drop)] = why
        named = parse_drop_name(drop.name)
        log.error("drop.stuck", drop=drop.name, bundle=named[0] if named else None, reason=why)
        if named is None:
            return
        try:
            state = load(self.layout.state)
            if named[0] in state.bundles:
                write_status(
                    self.layout, named[0], state.bundle(named[0]), errors=[why], drop=drop.name
                )
        except (OSError, ServiceError) as exc:
            log.error("status.unwritable", bundle=named[0], error=shown(exc))

    def empty_trash(self) -> None:
        """Remove the drops renamed into the trash (after the scan: they delay no one)."""
        try:
            names = os.listdir(self.layout.trash)
        except OSError:
            return
        for name in names:
            if str(self.layout.trash / name) in self.stuck:
                continue
            try:
                remove_tree(
                    self.layout.trash,
                    name,
                    max_entries=self.config.limits.max_tree_entries,
                    tick=self.tick,
                )
            except OSError as exc:
                self.quarantine(self.layout.trash / name, None, [f"could not be removed: {exc}"])


def _manifest_size(drop: Path) -> tuple[int, str]:
    """Sort key: drops with small manifests first, so a huge one delays no small one."""
    try:
        return os.lstat(drop / MANIFEST_NAME).st_size, drop.name
    except OSError:
        return 0, drop.name


def _unlink_manifest(drop: Path) -> None:
    """Unlink the drop's manifest first, so that a half-removed drop is never complete;
    never through a drop that is a symbolic link (the file it leads to is not the drop's)."""
    with contextlib.suppress(OSError):  # a directory there: remove_tree takes it
        fd = os.open(drop, DIR_FLAGS)
        try:
            os.unlink(MANIFEST_NAME, dir_fd=fd)
        finally:
            os.close(fd)

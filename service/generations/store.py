"""The store: verified, read-only copies of generations under ``store/<generation id>``.

A generation is built in a hidden temporary directory (``.tmp-*``), verified
there, and published by one rename to its id: a name in the store always means
a complete, verified generation. Files are read-only, directories too.
"""

from __future__ import annotations

import os
import re
import shutil
from collections.abc import Callable, Iterable
from pathlib import Path

from service import faults
from service.config import Limits
from service.dropfs import check_regular, open_file
from service.errors import DropError
from stager.schema.atomic import fsync_dir, fsync_file, write_atomic
from stager.schema.manifest import Manifest
from stager.schema.paths import MANIFEST_NAME

CHUNK = 1 << 20
_GENERATION = re.compile(r"[0-9a-f]{64}\Z")
TMP_PREFIX = ".tmp-"


class Store:
    """Generations on disk, rooted at ``root``."""

    def __init__(self, root: Path) -> None:
        self.root = root

    def path(self, generation: str) -> Path:
        """Where generation ``generation`` lives once published."""
        return self.root / generation

    def has(self, generation: str) -> bool:
        """Whether ``generation`` is published (its manifest exists)."""
        return (self.path(generation) / MANIFEST_NAME).is_file()

    def manifest(self, generation: str) -> Manifest:
        """The canonical manifest of a published generation."""
        return Manifest.read(self.path(generation), source=generation)

    def copy_drop(
        self,
        drop_fd: int,
        manifest: Manifest,
        *,
        display: Path,
        limits: Limits,
        tick: Callable[[], None] = lambda: None,
    ) -> Path:
        """Copy every file the manifest names out of the drop into a new temporary directory.

        The caller verifies the copies (never the container's files), then
        publishes or discards the directory. ``tick`` is called before each file and
        every 64 MiB copied (it feeds the watchdog and may raise to stop a slow drop).
        """
        entries = [m.file for m in manifest.modules] + [f.file for f in manifest.firmware]
        if len(entries) > limits.max_files:
            raise DropError(
                display, f"names {len(entries)} files, over the limit of {limits.max_files}"
            )
        self.root.mkdir(parents=True, exist_ok=True)
        tmp = self.root / f"{TMP_PREFIX}{os.urandom(8).hex()}"
        tmp.mkdir(mode=0o700)
        total = 0
        try:
            for rel in entries:
                left = limits.max_total_bytes - total
                budget = min(limits.max_file_bytes, left)
                limit = None
                if left < limits.max_file_bytes:
                    limit = (
                        f"the {left} bytes left of the drop's total limit of "
                        f"{limits.max_total_bytes}"
                    )
                tick()
                total += _copy(
                    drop_fd, rel, tmp, display=display, max_bytes=budget, limit=limit, tick=tick
                )
            write_atomic(tmp / MANIFEST_NAME, manifest.to_toml(), mode=0o444)
        except BaseException:
            self.discard(tmp)
            raise
        return tmp

    def publish(self, tmp: Path, generation: str) -> Path:
        """Make ``tmp`` read-only and rename it to ``generation`` (idempotent)."""
        final = self.path(generation)
        if self.has(generation):
            self.discard(tmp)
            return final
        self.discard(final)  # half removed by a killed collection: never a generation
        for directory, _dirs, files in os.walk(tmp, topdown=False):
            for name in files:
                os.chmod(Path(directory) / name, 0o444)
            fsync_dir(Path(directory))
            os.chmod(directory, 0o555)
        faults.hit("store.publish.renaming")
        os.replace(tmp, final)
        fsync_dir(self.root)
        faults.hit("store.published")
        return final

    def discard(self, path: Path) -> None:
        """Remove a temporary or collected generation directory, read-only or not."""
        if path.exists():
            for directory, _dirs, _files in os.walk(path):
                os.chmod(directory, 0o700)
            shutil.rmtree(path)

    def clean_temporaries(self) -> list[Path]:
        """Remove what a killed intake left behind; return it."""
        left = [p for p in self.root.glob(f"{TMP_PREFIX}*")] if self.root.is_dir() else []
        for path in left:
            self.discard(path)
        return left

    def clean_unpublished(self, referenced: set[str] | None) -> list[Path]:
        """Remove generation directories without a manifest that state does not name.

        A collection killed midway leaves such a half-deleted directory; nothing else
        would ever remove it. With ``referenced`` None (state unreadable) nothing goes.
        """
        if referenced is None or not self.root.is_dir():
            return []
        left = [
            p
            for p in self.root.iterdir()
            if _GENERATION.match(p.name) and p.name not in referenced and not self.has(p.name)
        ]
        for path in left:
            self.discard(path)
        return left

    def collect(self, generations: Iterable[str]) -> None:
        """Remove the given published generations."""
        for generation in generations:
            self.discard(self.path(generation))
        fsync_dir(self.root)


def _copy(
    drop_fd: int,
    rel: str,
    tmp: Path,
    *,
    display: Path,
    max_bytes: int,
    limit: str | None,
    tick: Callable[[], None],
) -> int:
    """Copy one checked file of the drop; return its size.

    What the drop does wrong is a :class:`DropError`; a failing write to the store
    (a full disk) stays an ``OSError``: it is the host's fault, and must not get the
    drop rejected and removed.
    """
    src = open_file(drop_fd, rel, display=display, max_bytes=max_bytes, limit=limit)
    dest = tmp / rel
    try:
        dest.parent.mkdir(parents=True, exist_ok=True)
        out = os.open(dest, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
        try:
            size = _pump(src, out, max_bytes + 1, display / rel, tick)
            fsync_file(out)
        finally:
            os.close(out)
        if size > max_bytes:
            raise DropError(
                display / rel, f"grew beyond the limit of {max_bytes} bytes while being copied"
            )
        check_regular(os.fstat(src), display / rel, max_bytes, limit)
    finally:
        os.close(src)
    return size


def _pump(src: int, out: int, cap: int, display: Path, tick: Callable[[], None]) -> int:
    """Copy up to ``cap`` bytes from ``src`` (the drop's file) to ``out``."""
    size = chunks = 0
    buf = bytearray(CHUNK)
    view = memoryview(buf)
    while size < cap:
        try:
            n = os.readv(src, [buf])
        except OSError as exc:
            raise DropError(display, f"cannot read: {exc.strerror or exc}") from exc
        if not n:
            break
        written = 0
        while written < n:
            written += os.write(out, view[written:n])
        size += n
        chunks += 1
        if chunks % 64 == 0:
            tick()
    return size

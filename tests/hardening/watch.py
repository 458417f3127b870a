"""Proof that nothing opened or read a file: inotify ``IN_OPEN | IN_ACCESS`` on canaries.

A watch on a directory also reports opens and reads of every file in it, so one
watch on the directory outside the drop covers every canary placed there. A watch on
a FIFO, device node or socket planted in a drop reports any ``open`` of that node
(the open that would run a driver's ``open`` or block on a FIFO); an ``O_PATH`` open
reports nothing, so the product's check-before-open is silent and any real open shows.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import stat
import struct
from pathlib import Path

IN_ACCESS = 0x001
IN_OPEN = 0x020
IN_Q_OVERFLOW = 0x4000
IN_IGNORED = 0x8000  # the watch went away (its inode was deleted): not an access
_IN_NONBLOCK = os.O_NONBLOCK
_IN_CLOEXEC = os.O_CLOEXEC
_libc = ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True)
_HEADER = struct.Struct("iIII")


class AccessWatch:
    """Collects every open or read of the watched paths until :meth:`close`."""

    def __init__(self, paths: list[Path]) -> None:
        self.fd = _libc.inotify_init1(_IN_NONBLOCK | _IN_CLOEXEC)
        if self.fd < 0:
            raise OSError(ctypes.get_errno(), "inotify_init1")
        self.paths: dict[int, Path] = {}
        for path in paths:
            self.add(path)

    def add(self, path: Path) -> None:
        """Watch one more path (no symlink followed: a planted link is watched itself)."""
        wd = _libc.inotify_add_watch(self.fd, os.fsencode(path), IN_OPEN | IN_ACCESS)
        if wd < 0:
            raise OSError(ctypes.get_errno(), f"inotify_add_watch {path}")
        self.paths[wd] = path

    def events(self) -> list[tuple[str, str]]:
        """``(path, "open" | "access" | "overflow")`` for everything seen so far."""
        out: list[tuple[str, str]] = []
        while True:
            try:
                data = os.read(self.fd, 65536)
            except BlockingIOError:
                return out
            pos = 0
            while pos < len(data):
                wd, mask, _cookie, length = _HEADER.unpack_from(data, pos)
                name = data[pos + _HEADER.size : pos + _HEADER.size + length].rstrip(b"\0")
                pos += _HEADER.size + length
                if mask & IN_IGNORED:
                    continue
                where = self.paths.get(wd, Path("?")) / os.fsdecode(name)
                kind = (
                    "overflow" if mask & IN_Q_OVERFLOW else "open" if mask & IN_OPEN else "access"
                )
                out.append((str(where), kind))

    def close(self) -> None:
        """Stop watching."""
        os.close(self.fd)


def special_files(top: Path) -> list[Path]:
    """Every FIFO, device node and socket at or below ``top``, following no symlink."""
    found: list[Path] = []
    try:
        if _special(os.lstat(top).st_mode):
            return [top]
    except FileNotFoundError:
        return []
    for dirpath, _dirs, files in os.walk(top):
        for name in files:
            path = Path(dirpath) / name
            if _special(os.lstat(path).st_mode):
                found.append(path)
    return found


def _special(mode: int) -> bool:
    return stat.S_ISFIFO(mode) or stat.S_ISCHR(mode) or stat.S_ISBLK(mode) or stat.S_ISSOCK(mode)

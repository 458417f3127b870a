"""Proof that nothing opened or read a file: inotify ``IN_OPEN | IN_ACCESS`` on canaries.

A watch on a directory also reports opens and reads of every file in it, so one
watch on the directory outside the drop covers every canary placed there.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import struct
from pathlib import Path

IN_ACCESS = 0x001
IN_OPEN = 0x020
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
            wd = _libc.inotify_add_watch(self.fd, os.fsencode(path), IN_OPEN | IN_ACCESS)
            if wd < 0:
                raise OSError(ctypes.get_errno(), f"inotify_add_watch {path}")
            self.paths[wd] = path

    def events(self) -> list[tuple[str, str]]:
        """``(path, "open" | "access")`` for everything seen so far."""
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
                where = self.paths.get(wd, Path("?")) / os.fsdecode(name)
                kind = "open" if mask & IN_OPEN else "access"
                out.append((str(where), kind))

    def close(self) -> None:
        """Stop watching."""
        os.close(self.fd)

"""The kernel's inotify, read directly: one instance, its watches, its events.

modstage reads inotify itself rather than through a library because what the daemon must
know, that the kernel's queue overflowed (``IN_Q_OVERFLOW``, events lost), is not part of
any file-watching library's public interface across the versions Debian ships (watchdog
2.2 drops the event; later versions report it only to private classes). The system calls
are three, the record format one struct (``inotify(7)``).
"""

from __future__ import annotations

import ctypes
import errno
import os
import struct
from dataclasses import dataclass

IN_CLOSE_WRITE = 0x00000008
IN_MOVED_FROM = 0x00000040
IN_MOVED_TO = 0x00000080
IN_CREATE = 0x00000100
IN_DELETE = 0x00000200
IN_DELETE_SELF = 0x00000400
IN_MOVE_SELF = 0x00000800
IN_Q_OVERFLOW = 0x00004000
IN_IGNORED = 0x00008000
IN_ONLYDIR = 0x01000000
IN_DONT_FOLLOW = 0x02000000

_HEADER = struct.Struct("iIII")  # wd, mask, cookie, len (struct inotify_event)
BUFFER = 64 * 1024  # many events a read; a single event is at most 16 + NAME_MAX + 1 bytes


@dataclass(frozen=True)
class RawEvent:
    """One ``struct inotify_event``: the watch (-1 for the queue's own events), the mask,
    the name within the watched directory (empty for the directory itself)."""

    wd: int
    mask: int
    name: bytes

    @property
    def overflow(self) -> bool:
        """The kernel's queue overflowed: events after some point were lost."""
        return bool(self.mask & IN_Q_OVERFLOW)


def parse(data: bytes) -> list[RawEvent]:
    """The events in one ``read`` of an inotify descriptor."""
    events, pos = [], 0
    while pos + _HEADER.size <= len(data):
        wd, mask, _cookie, length = _HEADER.unpack_from(data, pos)
        start = pos + _HEADER.size
        events.append(RawEvent(wd, mask, data[start : start + length].rstrip(b"\0")))
        pos = start + length
    return events


class Inotify:
    """An inotify instance, non-blocking and close-on-exec; ``fd`` is for ``poll``."""

    def __init__(self) -> None:
        self._libc = ctypes.CDLL(None, use_errno=True)
        fd = self._libc.inotify_init1(os.O_NONBLOCK | os.O_CLOEXEC)
        if fd < 0:
            err = ctypes.get_errno()
            raise OSError(err, f"inotify_init1: {os.strerror(err)}")
        self.fd: int = fd

    def add_watch(self, path: bytes, mask: int) -> int:
        """Watch ``path`` for the events in ``mask``; the watch descriptor."""
        wd = self._libc.inotify_add_watch(self.fd, path, mask)
        if wd < 0:
            err = ctypes.get_errno()
            raise OSError(err, os.strerror(err), os.fsdecode(path))
        return int(wd)

    def rm_watch(self, wd: int) -> None:
        """Stop a watch; one the kernel already dropped (its directory went) is no error."""
        if self._libc.inotify_rm_watch(self.fd, wd) < 0 and ctypes.get_errno() != errno.EINVAL:
            err = ctypes.get_errno()
            raise OSError(err, f"inotify_rm_watch: {os.strerror(err)}")

    def read(self) -> list[RawEvent]:
        """Every event queued now (none when none is)."""
        events: list[RawEvent] = []
        while True:
            try:
                data = os.read(self.fd, BUFFER)
            except BlockingIOError:
                return events
            if not data:
                return events
            events.extend(parse(data))

    def close(self) -> None:
        """Close the instance and with it every watch."""
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1

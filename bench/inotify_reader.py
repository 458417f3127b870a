"""The hand-written inotify reader modstage used before watchdog, kept as ``bench/watch``'s
reference: the kernel's inotify read directly (three system calls, one struct), one
instance and one thread for ``incoming/`` and a watch on each drop directory (at most
:data:`DropWatcher.MAX_DROP_WATCHES`), ``IN_Q_OVERFLOW`` an OVERFLOW event. Only the
benchmark imports it; the daemon watches drops with :mod:`service.daemon.watcher`.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import os
import select
import struct
import threading
from dataclasses import dataclass
from pathlib import Path

from service.daemon.events import Event, Kind, Queue

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


class DropWatcher:
    """An inotify watch on the incoming directory and on each drop in it, read by one thread.

    Not recursive: a container could otherwise spend root's inotify watches by creating
    directories. ``incoming/`` is watched for drops appearing; each drop directory (at
    most :data:`MAX_DROP_WATCHES`) for its manifest arriving. The daemon calls
    :meth:`track` from its own thread before every scan, so a manifest renamed in after
    the scan raises an event; beyond the cap the periodic rescan finds it. Watches are
    placed at once (the kernel queues their events until :meth:`start`); a drop that is
    not a directory, a symbolic link among them, is not watched.
    """

    MAX_DROP_WATCHES = 256
    # created, renamed in or out, written and closed, deleted; the watched directory itself
    # deleted or renamed
    MASK = (
        IN_CREATE
        | IN_MOVED_FROM
        | IN_MOVED_TO
        | IN_CLOSE_WRITE
        | IN_DELETE
        | IN_DELETE_SELF
        | IN_MOVE_SELF
        | IN_ONLYDIR
        | IN_DONT_FOLLOW
    )

    def __init__(self, incoming: Path, events: Queue) -> None:
        self.incoming = incoming
        self.events = events
        self.inotify = Inotify()
        self.paths: dict[int, Path] = {}  # watch descriptor -> the directory it watches
        self.drops: dict[str, int] = {}  # drop name -> its watch descriptor
        try:
            self.paths[self._watch(incoming)] = incoming
        except OSError:
            self.inotify.close()
            raise
        self._wake_r, self._wake_w = os.pipe()
        self._thread: threading.Thread | None = None

    def _watch(self, path: Path) -> int:
        return self.inotify.add_watch(os.fsencode(path), self.MASK)

    def track(self, names: set[str]) -> int:
        """Watch exactly the drop directories ``names`` (up to the cap); return how many not."""
        for name in sorted(set(self.drops) - names):
            wd = self.drops.pop(name)
            self.paths.pop(wd, None)
            with contextlib.suppress(OSError):  # the directory took its watch along
                self.inotify.rm_watch(wd)
        for name in sorted(names - set(self.drops))[: self.MAX_DROP_WATCHES - len(self.drops)]:
            with contextlib.suppress(OSError):  # gone already, or not a directory
                wd = self._watch(self.incoming / name)
                self.drops[name] = wd
                self.paths[wd] = self.incoming / name
        return len(names - set(self.drops))

    def start(self) -> None:
        """Start reading: every event since the watches were placed reaches the queue."""
        self._thread = threading.Thread(target=self._run, name="modstage-inotify", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        poller = select.poll()
        poller.register(self.inotify.fd, select.POLLIN)
        poller.register(self._wake_r, select.POLLIN)
        while True:
            ready = {fd for fd, _ in poller.poll()}
            if self._wake_r in ready:
                return
            for raw in self.inotify.read():
                event = self._event(raw)
                if event is not None:
                    self.events.put(event)

    def _event(self, raw: RawEvent) -> Event | None:
        if raw.overflow:
            return Event(Kind.OVERFLOW, "inotify queue overflowed")
        if raw.mask & IN_IGNORED:  # a watch went (track removed it, or its directory)
            return None
        where = self.paths.get(raw.wd, self.incoming)
        return Event(Kind.DROP, str(where / os.fsdecode(raw.name)) if raw.name else str(where))

    def stop(self) -> None:
        """Stop reading, join the thread, close the instance (and with it every watch)."""
        if self._wake_w < 0:
            return
        os.write(self._wake_w, b"x")
        if self._thread is not None:
            self._thread.join(timeout=5)
        for fd in (self._wake_r, self._wake_w):
            os.close(fd)
        self._wake_r = self._wake_w = -1
        self.inotify.close()
        self.drops.clear()
        self.paths.clear()

"""Event sources for the daemon: inotify on ``incoming/``, and the events of the kernel's
uevents (:mod:`service.daemon.uevents`).

The watchers run their own threads; they only put an :class:`Event` on the daemon's
queue. Nothing here reads or changes modstage's state.

The drop watch reads inotify itself (:mod:`service.daemon.inotify`), not through watchdog.
The loop must learn of a queue overflow (``IN_Q_OVERFLOW``: the kernel dropped events, so
a drop may have arrived unseen) to rescan at once rather than at the periodic rescan up to
300 s later, and no watchdog release offers that publicly: 2.2 (Debian 12's) discards the
event, and the releases that report it do so only to private classes, which bound modstage
to one watchdog version. Reading inotify directly sees the overflow as the kernel reports
it, whatever library is installed; it also watches every directory through one instance
and one thread, where watchdog's observer starts a thread per watch (257 for ``incoming/``
and 256 drops). ``bench/watch`` measures both.
"""

from __future__ import annotations

import contextlib
import enum
import os
import queue
import select
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from service.daemon import inotify

Queue = queue.Queue["Event"]


class Kind(enum.StrEnum):
    """What happened; the value is the name logs and tests use."""

    DROP = "drop"  # something changed in an incoming directory or in a drop
    OVERFLOW = "overflow"  # inotify lost events: rescan everything
    MEMORY = "memory"  # a memory block was added or went offline
    DEVICES = "devices"  # a PCI device appeared, went, or was bound or unbound
    MODULES = "modules"  # a kernel module was unloaded or loaded (detail: "remove nvidia")
    STOP = "stop"  # SIGTERM, SIGINT, or a test: leave the loop


@dataclass(frozen=True)
class Event:
    """Something happened, at ``at`` on the monotonic clock; ``detail`` says what."""

    kind: Kind
    detail: str = ""
    at: float = field(default_factory=time.monotonic)


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
    # created, renamed in or out, written and closed, deleted (watchdog's created, moved,
    # closed and deleted events before); the watched directory itself deleted or renamed
    MASK = (
        inotify.IN_CREATE
        | inotify.IN_MOVED_FROM
        | inotify.IN_MOVED_TO
        | inotify.IN_CLOSE_WRITE
        | inotify.IN_DELETE
        | inotify.IN_DELETE_SELF
        | inotify.IN_MOVE_SELF
        | inotify.IN_ONLYDIR
        | inotify.IN_DONT_FOLLOW
    )

    def __init__(self, incoming: Path, events: Queue) -> None:
        self.incoming = incoming
        self.events = events
        self.inotify = inotify.Inotify()
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

    def _event(self, raw: inotify.RawEvent) -> Event | None:
        if raw.overflow:
            return Event(Kind.OVERFLOW, "inotify queue overflowed")
        if raw.mask & inotify.IN_IGNORED:  # a watch went (track removed it, or its directory)
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

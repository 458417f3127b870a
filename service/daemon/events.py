"""Event sources for the daemon: inotify on ``incoming/``, and the events of the kernel's
uevents (:mod:`service.daemon.uevents`).

The libraries run their own threads; their callbacks only put an :class:`Event`
on the daemon's queue. Nothing here reads or changes modstage's state.
"""

from __future__ import annotations

import contextlib
import enum
import os
import queue
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

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
    """watchdog's inotify observer on the incoming directory and on each drop in it.

    Not recursive: a container could otherwise spend root's inotify watches by creating
    directories. ``incoming/`` is watched for drops appearing; each drop directory (at
    most :data:`MAX_DROP_WATCHES`) for its manifest arriving. The daemon calls
    :meth:`track` from its own thread before every scan, so a manifest renamed in after
    the scan raises an event; beyond the cap the periodic rescan finds it.
    """

    MAX_DROP_WATCHES = 256

    def __init__(self, incoming: Path, events: Queue) -> None:
        from watchdog.events import FileSystemEvent, FileSystemEventHandler
        from watchdog.observers.inotify import InotifyEmitter, InotifyObserver, InotifyWatchGroup

        class Handler(FileSystemEventHandler):
            def on_any_event(self, event: FileSystemEvent) -> None:
                if event.event_type in ("created", "moved", "closed", "deleted"):
                    events.put(Event(Kind.DROP, str(event.src_path)))

        class Group(InotifyWatchGroup):
            def on_queue_overflow(self) -> None:
                """The kernel dropped events: the loop rescans (watchdog rebuilds its watches)."""
                events.put(Event(Kind.OVERFLOW, "inotify queue overflowed"))
                super().on_queue_overflow()

        class Emitter(InotifyEmitter):
            """watchdog's emitter with :class:`Group` as its watch group (watchdog 7.1's
            constructor call, with our overflow callback)."""

            def on_thread_start(self) -> None:
                self._inotify = Group(
                    self._inotify_fd,
                    os.fsencode(self.watch.path),
                    is_recursive=self.watch.is_recursive,
                    event_mask=self.get_event_mask_from_filter(),
                    follow_symlink=self.watch.follow_symlink,
                )

        class Observer(InotifyObserver):
            def __init__(self) -> None:
                super().__init__()
                self._emitter_class = Emitter

        self.incoming = incoming
        self.handler = Handler()
        self.observer: Any = Observer()
        self.observer.schedule(self.handler, str(incoming), recursive=False)
        self.drops: dict[str, Any] = {}

    def track(self, names: set[str]) -> int:
        """Watch exactly the drop directories ``names`` (up to the cap); return how many not."""
        for name in sorted(set(self.drops) - names):
            watch = self.drops.pop(name)
            with contextlib.suppress(KeyError, OSError):  # the directory took its watch along
                self.observer.unschedule(watch)
        for name in sorted(names - set(self.drops))[: self.MAX_DROP_WATCHES - len(self.drops)]:
            with contextlib.suppress(OSError):  # gone already, or not a directory
                self.drops[name] = self.observer.schedule(
                    self.handler, str(self.incoming / name), recursive=False
                )
        return len(names - set(self.drops))

    def start(self) -> None:
        """Start watching (events from now on reach the queue)."""
        self.observer.start()

    def stop(self) -> None:
        """Stop watching and join the observer thread."""
        self.observer.stop()
        self.observer.join(timeout=5)

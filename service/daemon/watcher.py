"""The drop watch: watchdog's observer on the incoming directories, a hint for the loop.

One :class:`watchdog.observers.Observer`, one schedule per incoming directory, not
recursive: a recursive watch would let a container spend root's inotify watches by
creating directories, and a schedule per drop would cost a thread each. So a drop
directory appearing, going or renamed in an incoming directory is an event; its manifest
arriving inside it is not, and the loop polls while a drop directory waits for its
manifest (:meth:`DropWatcher.incomplete`).

watchdog's threads only put an :class:`~service.daemon.events.Event` on the loop's queue
(:class:`Handler`); nothing here reads or changes modstage's state. Events the kernel
dropped (its inotify queue overflowed) become one ``Kind.OVERFLOW``, a full rescan at once,
where the installed watchdog reports them (``watchdog.events.EventsLostEvent``); where it
does not, the loop's periodic rescan finds what they would have announced, and
:meth:`DropWatcher.start` logs which of the two holds.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path

import watchdog.events
from watchdog.events import FileSystemEvent, FileSystemEventHandler
from watchdog.observers import Observer
from watchdog.version import VERSION_STRING

from service.daemon.events import Event, Kind, Queue
from service.logs import get_logger
from stager.schema.paths import MANIFEST_NAME, parse_drop_name

log = get_logger("modstage.daemon")

#: watchdog's report that the kernel dropped events, in the releases that have one
LOST: type[FileSystemEvent] | None = getattr(watchdog.events, "EventsLostEvent", None)
#: the event types that may change which drops an incoming directory holds (not opened,
#: modified or attribute changes: a scan opening the drops must not raise another scan)
NOTICED = frozenset({"created", "moved", "deleted", "closed"})


class Handler(FileSystemEventHandler):
    """watchdog's events as the loop's, on watchdog's thread: a put on the queue, no more."""

    def __init__(self, events: Queue, lost: type[FileSystemEvent] | None = LOST) -> None:
        super().__init__()
        self.events = events
        self.lost = lost

    def dispatch(self, event: FileSystemEvent) -> None:
        """One event from the observer: a lost-events report or a change to the drops."""
        if self.lost is not None and isinstance(event, self.lost):
            self.events.put(Event(Kind.OVERFLOW, "the kernel's inotify queue overflowed"))
        elif event.event_type in NOTICED:
            path = getattr(event, "dest_path", "") or event.src_path  # where a move ends
            self.events.put(Event(Kind.DROP, os.fsdecode(path)))


class DropWatcher:
    """watchdog's observer on every incoming directory (each resolved by the caller).

    The schedules are made at once; the watches are placed at :meth:`start` (a missing
    directory raises there), so the loop's first scan, after it, sees what came before.
    """

    def __init__(self, dirs: Sequence[Path], events: Queue) -> None:
        self.dirs = tuple(dirs)
        self.handler = Handler(events)
        self.observer = Observer()
        for directory in self.dirs:
            self.observer.schedule(self.handler, str(directory), recursive=False)

    @property
    def reports_lost_events(self) -> bool:
        """Whether an overflow of the kernel's queue reaches the loop (else: the rescan)."""
        return self.handler.lost is not None

    def start(self) -> None:
        """Place the watches and start watchdog's threads; log how lost events are found."""
        self.observer.start()
        log.info(
            "drops.watching",
            incoming=[str(d) for d in self.dirs],
            watchdog=VERSION_STRING,
            lost_events="a full rescan at once"
            if self.reports_lost_events
            else "not reported by this watchdog: found by the periodic rescan",
        )

    def incomplete(self) -> int:
        """How many drop directories wait for their manifest (no event says when it comes).

        A symbolic link named as a drop is no drop directory; an unreadable incoming
        directory holds none.
        """
        waiting = 0
        for directory in self.dirs:
            try:
                entries = list(os.scandir(directory))
            except OSError:
                continue
            for entry in entries:
                try:
                    if (
                        parse_drop_name(entry.name)
                        and entry.is_dir(follow_symlinks=False)
                        and not os.path.lexists(os.path.join(entry.path, MANIFEST_NAME))
                    ):
                        waiting += 1
                except OSError:  # gone while we looked
                    continue
        return waiting

    def stop(self) -> None:
        """Stop watchdog's threads and close its watches (nothing to do if never started)."""
        if self.observer.is_alive():
            self.observer.stop()
            self.observer.join(timeout=5)

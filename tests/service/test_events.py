"""The drop watcher's events: an inotify queue overflow reaches the loop as a typed event."""

from __future__ import annotations

import queue
import time
from pathlib import Path

from service.daemon.events import DropWatcher, Event, Kind


def test_an_inotify_overflow_is_an_overflow_event(tmp_path: Path) -> None:
    """When the kernel reports IN_Q_OVERFLOW, watchdog calls its watch groups'
    ``on_queue_overflow``: the loop's queue gets ``Kind.OVERFLOW`` (it then rescans), and
    the watcher keeps reporting drops afterwards."""
    events: queue.Queue[Event] = queue.Queue()
    watcher = DropWatcher(tmp_path, events)
    watcher.start()
    try:
        deadline = time.monotonic() + 5
        while not any(e._inotify for e in watcher.observer.emitters):
            assert time.monotonic() < deadline, "the emitter never started"
            time.sleep(0.01)
        (emitter,) = watcher.observer.emitters
        emitter._inotify.on_queue_overflow()  # what InotifyFD.handle_event calls
        assert events.get(timeout=5).kind is Kind.OVERFLOW
        (tmp_path / "test.1.aa").mkdir()
        assert events.get(timeout=5).kind is Kind.DROP
    finally:
        watcher.stop()

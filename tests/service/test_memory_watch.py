"""The daemon's memory watcher hears the kernel, not udevd."""

from __future__ import annotations

import queue
from pathlib import Path

from service.daemon.events import Event, MemoryWatcher


def test_memory_watcher_listens_to_kernel_uevents_even_with_udevd(tmp_path: Path) -> None:
    """With udevd's control socket present the source stays the kernel (no wait for rules)."""
    run_udev = tmp_path / "run/udev"
    run_udev.mkdir(parents=True)
    (run_udev / "control").touch()
    events: queue.Queue[Event] = queue.Queue()
    watcher = MemoryWatcher(run_udev, events)
    assert watcher.source == "kernel"
    watcher.start()
    watcher.stop()
    assert events.empty()

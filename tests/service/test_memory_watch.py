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


def test_blocks_named_by_uevents_are_onlined_highest_first_and_only_if_offline(
    tmp_path: Path,
) -> None:
    """online_blocks(only=...) writes each named offline block, highest first; an online
    block or one that does not exist is left alone and is no error."""
    from service.kernel.memory import online_blocks
    from stager.manifest import MemoryPolicy
    from tests.service.fakes import FakeSysfs

    memory = tmp_path / "devices/system/memory"
    for n, state in {0: "online", 1: "offline", 2: "offline", 3: "online"}.items():
        (memory / f"memory{n}").mkdir(parents=True)
        (memory / f"memory{n}/state").write_text(state + "\n")
    ticks = iter(range(100))
    done = online_blocks(
        FakeSysfs(tmp_path),
        MemoryPolicy.ONLINE_MOVABLE,
        since=0,
        clock=lambda: float(next(ticks)),
        only=[3, 1, 2, 7, 2],
    )
    assert [(d.block, d.state) for d in done] == [
        (2, "online_movable"),
        (1, "online_movable"),
    ]
    assert [d.latency_ms for d in done] == [0.0, 1000.0]
    assert (memory / "memory3/state").read_text() == "online\n"
    assert (memory / "memory1/state").read_text() == "online\n"  # the kernel's readback
    assert (memory / "memory1/valid_zones").read_text() == "Movable\n"

"""The drop watcher's events: real inotify, a real queue overflow reaching the loop as a
typed event, and the watcher's own inotify reading."""

from __future__ import annotations

import os
import queue
import threading
import time
from pathlib import Path

from service.daemon import inotify
from service.daemon.events import DropWatcher, Event, Kind


def _max_queued() -> int:
    return int(Path("/proc/sys/fs/inotify/max_queued_events").read_text())


def _flood(directory: Path) -> None:
    """Queue more events than the kernel keeps for one inotify instance: each new file is
    a create and a close-after-write, none merged with the one before (their names differ)."""
    for i in range(_max_queued() // 2 + 64):
        (directory / f"f{i}").write_bytes(b"")


def _drain(events: queue.Queue[Event]) -> list[Event]:
    seen = []
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        try:
            seen.append(events.get(timeout=0.5))
        except queue.Empty:
            break
    return seen


def test_a_real_inotify_overflow_is_an_overflow_event(tmp_path: Path) -> None:
    """When the kernel's queue overflows (more events than ``max_queued_events`` while
    nobody reads) and reports ``IN_Q_OVERFLOW``, the loop's queue gets ``Kind.OVERFLOW``
    (the loop then rescans at once), and the watcher keeps reporting drops afterwards."""
    events: queue.Queue[Event] = queue.Queue()
    watcher = DropWatcher(tmp_path, events)  # watching, not reading yet
    try:
        _flood(tmp_path)
        watcher.start()
        kinds = [e.kind for e in _drain(events)]
        assert Kind.OVERFLOW in kinds, f"{len(kinds)} events, no overflow"
        (tmp_path / "test.1.aa").mkdir()
        after = events.get(timeout=5)
        assert after.kind is Kind.DROP and after.detail == str(tmp_path / "test.1.aa")
    finally:
        watcher.stop()


def test_no_overflow_event_without_an_overflow(tmp_path: Path) -> None:
    """Events under the kernel's limit are drops, never an overflow (the test above can
    fail: the flood is what makes the overflow)."""
    events: queue.Queue[Event] = queue.Queue()
    watcher = DropWatcher(tmp_path, events)
    try:
        for i in range(100):
            (tmp_path / f"f{i}").write_bytes(b"")
        watcher.start()
        kinds = [e.kind for e in _drain(events)]
        assert kinds and set(kinds) == {Kind.DROP}
    finally:
        watcher.stop()


def test_a_manifest_in_a_tracked_drop_names_its_path_and_untracked_drops_are_silent(
    tmp_path: Path,
) -> None:
    """A tracked drop's manifest arriving is a DROP event naming the file; once the drop
    is no longer tracked its changes raise nothing (only incoming/ itself stays watched),
    and a symbolic link among the drops is never watched (nor what it points to)."""
    events: queue.Queue[Event] = queue.Queue()
    drop, other = tmp_path / "test.1.aa", tmp_path.parent / f"{tmp_path.name}-elsewhere"
    drop.mkdir()
    other.mkdir()
    (tmp_path / "test.2.bb").symlink_to(other)
    watcher = DropWatcher(tmp_path, events)
    watcher.start()
    try:
        assert watcher.track({"test.1.aa", "test.2.bb"}) == 1  # the link: not watched
        (drop / "manifest.toml").write_bytes(b"")
        (other / "manifest.toml").write_bytes(b"")
        seen = [(e.kind, e.detail) for e in _drain(events)]
        assert seen == [(Kind.DROP, str(drop / "manifest.toml"))] * 2  # create, close-write
        watcher.track(set())
        (drop / "more").write_bytes(b"")
        assert _drain(events) == []
    finally:
        watcher.stop()
    assert watcher.inotify.fd == -1


def test_stop_ends_the_reader_thread_and_closes_its_descriptors(tmp_path: Path) -> None:
    """After stop() no thread of the watcher is left and its inotify instance is closed, so a
    daemon that restarts its watchers leaks neither."""
    before = threading.active_count()
    watcher = DropWatcher(tmp_path, queue.Queue())
    watcher.start()
    fd = watcher.inotify.fd
    assert os.readlink(f"/proc/self/fd/{fd}") == "anon_inode:inotify"
    watcher.stop()
    assert threading.active_count() == before
    assert watcher.inotify.fd == -1


def test_parse_reads_every_record_of_one_read() -> None:
    """Records are a 16-byte header and a NUL-padded name; one read holds several."""
    import struct

    blob = struct.pack("iIII", 1, inotify.IN_CREATE, 0, 16) + b"manifest.toml".ljust(16, b"\0")
    blob += struct.pack("iIII", -1, inotify.IN_Q_OVERFLOW, 0, 0)
    first, second = inotify.parse(blob)
    assert (first.wd, first.name, first.overflow) == (1, b"manifest.toml", False)
    assert (second.wd, second.overflow) == (-1, True)

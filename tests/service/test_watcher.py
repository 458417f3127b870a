"""The drop watch (watchdog's observer): real inotify through the installed watchdog, one
observer over every incoming directory, a real overflow of the kernel's queue, and the
drop directories that wait for their manifest (polled by the loop)."""

from __future__ import annotations

import json
import os
import queue
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import watchdog.events
from watchdog.events import FileSystemEvent

from service.daemon.events import Event, Kind
from service.daemon.watcher import LOST, DropWatcher, Handler
from stager.schema.paths import MANIFEST_NAME

ROOT = Path(__file__).resolve().parents[2]
DROP = "test.00000000000000000001.aa"  # a name parse_drop_name accepts


def _drain(events: queue.Queue[Event], quiet: float = 0.5) -> list[Event]:
    """Every event until none came for ``quiet`` seconds (10 s at most)."""
    seen = []
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        try:
            seen.append(events.get(timeout=quiet))
        except queue.Empty:
            break
    return seen


def _until(events: queue.Queue[Event], path: Path, timeout: float = 5.0) -> list[Event]:
    """Events up to and with the first that names ``path``; fails after ``timeout``."""
    seen: list[Event] = []
    deadline = time.monotonic() + timeout
    while not seen or seen[-1].detail != str(path):
        seen.append(events.get(timeout=max(0.0, deadline - time.monotonic())))
    return seen


def _inotify_watches() -> int:
    """inotify watches this process holds now (each a ``inotify wd:`` line in fdinfo)."""
    count = 0
    for fd in os.listdir("/proc/self/fdinfo"):
        try:
            if os.readlink(f"/proc/self/fd/{fd}") == "anon_inode:inotify":
                text = Path(f"/proc/self/fdinfo/{fd}").read_text()
                count += text.count("inotify wd:")
        except OSError:
            continue
    return count


@pytest.fixture
def incoming(tmp_path: Path) -> Iterator[tuple[list[Path], queue.Queue[Event], DropWatcher]]:
    """Two incoming directories, one started watcher over both; stopped afterwards."""
    dirs = [tmp_path / "incoming", tmp_path / "pod"]
    for d in dirs:
        d.mkdir()
    events: queue.Queue[Event] = queue.Queue()
    watcher = DropWatcher(dirs, events)
    watcher.start()
    try:
        yield dirs, events, watcher
    finally:
        watcher.stop()


def test_a_drop_appearing_in_any_incoming_directory_is_a_drop_event(
    incoming: tuple[list[Path], queue.Queue[Event], DropWatcher],
) -> None:
    """A drop directory made in either incoming directory is a DROP event naming it: one
    observer serves both."""
    dirs, events, _ = incoming
    for d in dirs:
        (d / DROP).mkdir()
        assert {e.kind for e in _until(events, d / DROP)} == {Kind.DROP}


def test_a_drop_renamed_in_or_removed_is_a_drop_event(
    incoming: tuple[list[Path], queue.Queue[Event], DropWatcher], tmp_path: Path
) -> None:
    """A drop staged elsewhere and renamed in is an event naming where it now is; a drop
    removed (the stager superseding it, intake done with it) is an event too."""
    dirs, events, _ = incoming
    staged = tmp_path / "staged"
    staged.mkdir()
    (staged / MANIFEST_NAME).write_bytes(b"")
    staged.rename(dirs[0] / DROP)
    _until(events, dirs[0] / DROP)
    (dirs[0] / DROP / MANIFEST_NAME).unlink()
    (dirs[0] / DROP).rmdir()
    assert _until(events, dirs[0] / DROP)[-1].kind is Kind.DROP


def test_what_happens_inside_a_drop_or_a_scan_raises_no_event(
    incoming: tuple[list[Path], queue.Queue[Event], DropWatcher],
) -> None:
    """Not recursive: files written inside a drop raise nothing (its manifest's arrival is
    polled, see :meth:`DropWatcher.incomplete`), and neither does a scan opening and
    listing the drops (the loop's own scan must not call for another)."""
    dirs, events, watcher = incoming
    drop = dirs[0] / DROP
    drop.mkdir()
    _until(events, drop)
    _drain(events)
    (drop / "modules").mkdir()
    (drop / "modules" / "x.ko").write_bytes(b"\0" * 4096)
    (drop / ".manifest.tmp").write_bytes(b"")
    (drop / ".manifest.tmp").rename(drop / MANIFEST_NAME)
    for d in dirs:
        for entry in os.scandir(d):
            list(os.scandir(entry.path))
    assert watcher.incomplete() == 0
    assert _drain(events) == []


def test_incomplete_counts_the_drop_directories_that_wait_for_their_manifest(
    tmp_path: Path,
) -> None:
    """A directory named as a drop and holding no manifest waits (in any incoming
    directory); a complete drop, a symbolic link or a file named as a drop, a directory
    not named as one, and a missing incoming directory count nothing. No watch is needed
    to count (the watcher need not run)."""
    a, b, outside = tmp_path / "a", tmp_path / "b", tmp_path / "outside"
    for d in (a, b, outside):
        d.mkdir()
    (a / DROP).mkdir()
    (b / DROP).mkdir()
    (b / "test.00000000000000000002.bb").mkdir()
    (b / "test.00000000000000000002.bb" / MANIFEST_NAME).write_bytes(b"")
    (b / "test.00000000000000000003.cc").symlink_to(outside)
    (b / "test.00000000000000000004.dd").write_bytes(b"")
    (b / "junk").mkdir()
    watcher = DropWatcher([a, b, tmp_path / "missing"], queue.Queue())
    assert watcher.incomplete() == 2
    (a / DROP / MANIFEST_NAME).symlink_to(outside / "nowhere")  # present, if dangling
    assert watcher.incomplete() == 1
    watcher.stop()  # never started: nothing to stop


def test_one_watch_per_incoming_directory_however_many_drops(
    tmp_path: Path,
) -> None:
    """The watches and watchdog's threads are per incoming directory, not per drop: 300
    drop directories add neither; stop() leaves no thread and no watch behind."""
    dirs = [tmp_path / "a", tmp_path / "b"]
    for d in dirs:
        d.mkdir()
    threads, watches = threading.active_count(), _inotify_watches()
    watcher = DropWatcher(dirs, queue.Queue())
    watcher.start()
    try:
        started = threading.active_count()
        assert _inotify_watches() - watches == len(dirs)
        assert started - threads <= 1 + 2 * len(dirs)  # the observer; emitter (and reader)
        for i in range(300):
            (dirs[i % 2] / f"junk.{i:020d}.{i:016x}").mkdir()
        time.sleep(0.5)
        assert threading.active_count() == started
        assert _inotify_watches() - watches == len(dirs)
    finally:
        watcher.stop()
    assert threading.active_count() == threads
    assert _inotify_watches() == watches


class _StandIn(FileSystemEvent):
    """A lost-events report as a watchdog that has one would dispatch it."""

    event_type = "lost"

    def __init__(self) -> None:
        super().__init__("")


def test_a_lost_events_report_is_one_overflow_event() -> None:
    """watchdog's lost-events report (the class it names, where the release has one) is an
    OVERFLOW event on the queue, a full rescan; with no such class an event of another
    type is neither a drop nor an overflow. The watcher uses the installed watchdog's
    ``EventsLostEvent`` exactly when it exists."""
    events: queue.Queue[Event] = queue.Queue()
    Handler(events, lost=_StandIn).dispatch(_StandIn())
    Handler(events, lost=None).dispatch(_StandIn())
    assert [e.kind for e in _drain(events, quiet=0.05)] == [Kind.OVERFLOW]
    assert getattr(watchdog.events, "EventsLostEvent", None) is LOST
    assert DropWatcher([], queue.Queue()).reports_lost_events is (LOST is not None)


def test_start_logs_how_lost_events_are_found(tmp_path: Path) -> None:
    """At start the watcher says which watchdog runs and whether an overflow of the
    kernel's queue reaches the loop or is left to the periodic rescan."""
    from structlog.testing import capture_logs

    watcher = DropWatcher([tmp_path], queue.Queue())
    with capture_logs() as logs:
        watcher.start()
    watcher.stop()
    [started] = [e for e in logs if e["event"] == "drops.watching"]
    assert started["watchdog"] == watchdog.version.VERSION_STRING  # type: ignore[attr-defined]
    assert started["incoming"] == [str(tmp_path)]
    assert ("rescan at once" in started["lost_events"]) is (LOST is not None)
    assert ("periodic rescan" in started["lost_events"]) is (LOST is None)


_CHILD = """
import json, queue, sys
from pathlib import Path
from service.daemon.watcher import DropWatcher
events = queue.Queue()
watcher = DropWatcher([Path(sys.argv[1])], events)
watcher.start()
print("ready", flush=True)
seen = 0
while True:
    try:
        e = events.get(timeout=0.5)
    except queue.Empty:
        print(json.dumps(["quiet", str(seen)]), flush=True)  # caught up
        continue
    seen += 1
    if e.kind != "drop" or e.detail.endswith("after"):
        print(json.dumps([str(e.kind), e.detail]), flush=True)
"""


def test_a_real_overflow_of_the_kernels_queue(tmp_path: Path) -> None:
    """The watching process is stopped (SIGSTOP) while more events than the kernel keeps
    (``max_queued_events``) arrive: the kernel's queue overflows. Resumed, the watcher
    goes on reporting drops, and the overflow is an OVERFLOW event exactly where the
    installed watchdog reports lost events (elsewhere the periodic rescan finds what was
    lost: ``tests/service/test_daemon.py``)."""
    limit = int(Path("/proc/sys/fs/inotify/max_queued_events").read_text())
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), *sys.path[1:]])}
    child = subprocess.Popen(
        [sys.executable, *(["-S"] if sys.flags.no_site else []), "-c", _CHILD, str(tmp_path)],
        stdout=subprocess.PIPE,
        text=True,
        env=env,
        cwd=ROOT,
    )
    assert child.stdout is not None
    try:
        while (line := child.stdout.readline()) and line.strip() != "ready":
            pass  # the watcher's own log line, on a console
        assert line, "the watcher did not start"
        os.kill(child.pid, signal.SIGSTOP)
        for i in range(limit + 64):  # a create and a close-after-write each: twice the limit
            (tmp_path / f"f{i}").write_bytes(b"")
        os.kill(child.pid, signal.SIGCONT)
        lines: list[list[str]] = []
        timer = threading.Timer(30, child.kill)
        timer.start()
        try:
            while not lines or lines[-1] != ["drop", str(tmp_path / "after")]:
                line = child.stdout.readline()
                assert line, f"the watcher reported no drop after the overflow: {lines}"
                lines.append(json.loads(line))
                if lines[-1][0] == "quiet" and lines[-1][1] != "0":
                    # caught up with the storm (until then the kernel's queue may still be
                    # full and drop this event too): a new drop must be reported
                    (tmp_path / "after").mkdir(exist_ok=True)
        finally:
            timer.cancel()
    finally:
        child.kill()
        child.wait()
        child.stdout.close()
    caught_up = [int(n) for kind, n in lines if kind == "quiet"]
    assert 0 < max(caught_up) < 2 * limit, "no overflow: every event arrived"
    overflows = [kind for kind, _ in lines if kind == "overflow"]
    assert len(overflows) == (1 if LOST is not None else 0), lines

"""The daemon on a temporary root: real files, recording reboot backends; the real drop
watch (watchdog's observer) where a drop must be noticed, a fake clock driving the loop
where time must pass."""

from __future__ import annotations

import json
import queue
import shutil
import threading
import time
from collections.abc import Iterator
from datetime import time as daytime
from pathlib import Path
from typing import Any

import pytest
from structlog.testing import capture_logs
from watchdog.events import FileSystemEvent

from service.bundles.phase import Phase
from service.bundles.records import RebootIntent
from service.bundles.statefile import load
from service.config import Config, RebootConfig
from service.daemon.clock import SystemClock
from service.daemon.events import Event, Kind
from service.daemon.loop import Daemon
from service.daemon.watcher import DropWatcher, Handler
from service.host.running import RunningHost
from service.intake.scan import Intake
from service.layout import Layout
from service.rebooting.backends import BACKENDS
from service.rebooting.request import CommandRebooter, KuredSentinel, NoRebooter
from service.rebooting.window import Guard, Window
from service.verify.signature.trust import TrustStore
from stager.drop import ModuleSpec, stage
from tests.service.conftest import HostTree
from tests.service.fake_clock import FakeClock
from tests.service.fakes import FakeKeyring, FakeSysfs


@pytest.fixture
def host(host_tree: HostTree) -> Layout:
    """A host tree with two offline memory blocks."""
    return host_tree({0: "online", 1: "offline", 2: "offline"})


class CountingIntake(Intake):
    """The real intake, counting its scans (proof that a scan ran)."""

    scans = 0

    def run(self) -> Any:
        self.scans += 1
        return super().run()


def _daemon(host: Layout, rebooter: object, clock: object = None, **config: object) -> Daemon:
    cfg = Config(**config)  # type: ignore[arg-type]
    intake = CountingIntake(host, cfg, TrustStore.from_directory(host.trusted), FakeKeyring(set()))
    return Daemon(
        host, cfg, intake, rebooter, clock=clock or SystemClock(), sysfs=FakeSysfs(host.sys)
    )  # type: ignore[arg-type]


def _scans(daemon: Daemon) -> int:
    assert isinstance(daemon.intake, CountingIntake)
    return daemon.intake.scans


@pytest.fixture
def running(host: Layout) -> Iterator[list[Daemon]]:
    """Run a daemon's loop with the real drop watch in a thread; stop it afterwards."""
    started: list[Daemon] = []
    threads: list[threading.Thread] = []
    watchers: list[DropWatcher] = []

    def start(daemon: Daemon) -> None:
        watcher = DropWatcher([host.incoming], daemon.events)
        watcher.start()
        watchers.append(watcher)
        daemon.watcher = watcher
        daemon.reconcile()
        thread = threading.Thread(target=daemon.loop, daemon=True)
        thread.start()
        started.append(daemon)
        threads.append(thread)

    yield start  # type: ignore[misc]
    for daemon in started:
        daemon.events.put(Event(Kind.STOP))
    for thread in threads:
        thread.join(timeout=10)
        assert not thread.is_alive()
    for watcher in watchers:
        watcher.stop()


def _wait(predicate: object, timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():  # type: ignore[operator]
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.02)


def test_drop_is_noticed_taken_in_and_reboot_asked(
    host: Layout, module: Path, kernel: str, running: object
) -> None:
    """A drop written while the daemon runs becomes pending and one reboot is asked for."""
    asked: list[list[str]] = []
    rebooter = CommandRebooter(lambda: [["reboot-now"]], runner=asked.append)
    daemon = _daemon(
        host, rebooter, reboot=RebootConfig(backend="command", command=("x",), guard=Guard(0, 3600))
    )
    running(daemon)  # type: ignore[operator]
    stage(host.incoming, bundle="test", version="1", kernel=kernel, modules=[ModuleSpec(module)])
    _wait(
        lambda: (
            host.state.exists() and load(host.state).bundle("test").phase is Phase.REBOOT_SCHEDULED
        )
    )
    _wait(lambda: asked == [["reboot-now"]])
    state = load(host.state)
    assert state.reboot is not None and state.reboot.bundles == ("test",)
    metrics = host.metrics.read_text()  # refreshed on every change
    assert "\nmodstage_reboot_required 1.0\n" in metrics
    assert 'modstage_verification_seconds{bundle="test"}' in metrics
    assert list(host.incoming.iterdir()) == []


def _decided(host: Layout) -> str:
    return str(json.loads(host.heartbeat.read_text())["reboot_decision"])


def test_the_guard_allows_one_request_per_min_interval(
    host: Layout, module: Path, kernel: str
) -> None:
    """A second drop within min_interval is taken in but not asked for until the interval
    has passed on the clock; then the re-check asks at once (the loop was running)."""
    asked: list[float] = []
    clock = FakeClock()
    rebooter = CommandRebooter(lambda: [["reboot-now"]], runner=lambda _: asked.append(clock.wall))
    guard = Guard(min_delay=0, min_interval=3610)  # not a multiple of the 30 s heartbeat
    daemon = _daemon(host, rebooter, clock, reboot=RebootConfig(backend="command", guard=guard))
    stage(host.incoming, bundle="test", version="1", kernel=kernel, modules=[ModuleSpec(module)])
    clock.run_for(1)
    daemon.loop()
    first = clock.wall
    assert asked and asked[0] <= first and load(host.state).reboot is not None
    stage(host.incoming, bundle="test", version="2", kernel=kernel, modules=[ModuleSpec(module)])
    daemon.events.put(Event(Kind.DROP, "test", at=clock.mono))
    clock.run_for(3500)
    daemon.loop()
    assert load(host.state).bundle("test").phase is Phase.PENDING  # the drop was taken in
    assert _scans(daemon) >= 3 and clock.wall - first == 3500  # the loop ran all along
    assert _decided(host).startswith("a reboot was asked for "), _decided(host)
    assert len(asked) == 1, "the guard allows one request per min_interval"
    clock.run_for(200)
    daemon.loop()
    assert len(asked) == 2 and asked[1] - asked[0] == 3610  # asked again, at the second


def test_a_held_reboot_is_asked_for_when_the_window_opens(
    host: Layout, module: Path, kernel: str
) -> None:
    """Outside the window the daemon re-checks until the window opens and asks for the reboot
    at its opening (the typed decision's numbers set the re-check), then not again."""
    asked: list[float] = []
    clock = FakeClock()  # 12:00 UTC
    window = Window(start=daytime(12, 10, 10), end=daytime(13, 0))  # off the heartbeat's beat
    reboot = RebootConfig(backend="command", guard=Guard(0, 3600), window=window)
    daemon = _daemon(
        host,
        CommandRebooter(lambda: [["r"]], runner=lambda _: asked.append(clock.wall)),
        clock,
        reboot=reboot,
    )
    stage(host.incoming, bundle="test", version="1", kernel=kernel, modules=[ModuleSpec(module)])
    clock.run_for(599)
    daemon.loop()
    assert load(host.state).bundle("test").phase is Phase.PENDING and asked == []
    assert _decided(host) == "outside the reboot window"
    clock.run_for(1200)
    daemon.loop()
    assert asked == [clock.now().replace(hour=12, minute=10, second=10).timestamp()]
    assert load(host.state).bundle("test").phase is Phase.REBOOT_SCHEDULED


def test_a_reboot_waits_min_delay_after_the_last_drop(
    host: Layout, module: Path, kernel: str
) -> None:
    """The request comes min_delay after the drop was taken in, not before, not much after."""
    asked: list[float] = []
    clock = FakeClock()
    reboot = RebootConfig(backend="command", guard=Guard(min_delay=45, min_interval=3600))
    daemon = _daemon(
        host,
        CommandRebooter(lambda: [["r"]], runner=lambda _: asked.append(clock.wall)),
        clock,
        reboot=reboot,
    )
    stage(host.incoming, bundle="test", version="1", kernel=kernel, modules=[ModuleSpec(module)])
    clock.run_for(44)
    daemon.loop()
    assert daemon.last_drop is not None and asked == []
    assert _decided(host).startswith("waiting ") and _decided(host).endswith(
        " s after the last drop"
    )
    clock.run_for(100)
    daemon.loop()
    assert len(asked) == 1 and 45 <= asked[0] - daemon.last_drop < 46


def test_incomplete_drop_is_left_alone(host: Layout) -> None:
    """A drop directory without its manifest is not touched by the daemon, scan after scan."""
    clock = FakeClock()
    daemon = _daemon(host, NoRebooter(), clock)
    partial = host.incoming / "test.00000000000000000001.ab"
    (partial / "modules").mkdir(parents=True)
    (partial / "modules" / "x.ko").write_bytes(b"half")
    daemon.events.put(Event(Kind.DROP, str(partial), at=clock.mono))
    clock.run_for(1000)
    daemon.loop()
    assert _scans(daemon) >= 4  # at start, then every rescan_every (300 s)
    assert (partial / "modules" / "x.ko").read_bytes() == b"half"
    assert not host.state.exists()


def test_burst_of_drops_ends_with_the_newest_pending(
    host: Layout, module: Path, kernel: str, running: object
) -> None:
    """Twenty drops of one bundle in a burst: the newest is pending, the rest superseded."""
    daemon = _daemon(host, NoRebooter())
    running(daemon)  # type: ignore[operator]
    for version in range(20):
        stage(
            host.incoming,
            bundle="test",
            version=str(version),
            kernel=kernel,
            modules=[ModuleSpec(module)],
        )
    _wait(
        lambda: (
            host.state.exists()
            and not list(host.incoming.iterdir())
            and load(host.state).bundle("test").pending is not None
        )
    )
    b = load(host.state).bundle("test")
    assert b.generations[str(b.pending)].version == "19"


def test_restart_is_not_a_reboot(host: Layout) -> None:
    """Same boot id: the intent stays. New boot id: the intent and kured's sentinel go."""
    sentinel = host.root / "var/run/reboot-required"
    kured = KuredSentinel(sentinel)
    daemon = _daemon(host, kured)
    from dataclasses import replace

    from service.bundles.statefile import save

    save(
        host.state,
        replace(
            load(host.state),
            reboot=RebootIntent(1.0, host.boot_id.read_text().strip(), "kured"),
        ),
    )
    kured.request("test")
    daemon.reconcile()
    assert load(host.state).reboot is not None and sentinel.exists()
    host.boot_id.write_text("99999999-0000-0000-0000-000000000000\n")
    daemon.reconcile()
    assert load(host.state).reboot is None and not sentinel.exists()


def test_hot_added_memory_is_onlined_per_policy(host: Layout) -> None:
    """Offline blocks are onlined movable, highest first, each logged with a latency.

    An ``add`` uevent onlines the blocks it names (no walk over every block); the pass at
    start (no events) and any other memory event go over every block.
    """
    daemon = _daemon(host, NoRebooter(), hotplug_policy="online_movable")
    done = daemon.online_memory(
        [Event(Kind.MEMORY, "add memory2"), Event(Kind.MEMORY, "add memory9")]
    )
    assert [(d.block, d.state) for d in done] == [(2, "online_movable")]
    assert all(d.latency_ms is not None and d.latency_ms >= 0 for d in done)
    done = daemon.online_memory([])
    assert [(d.block, d.state) for d in done] == [(1, "online_movable")]
    memory = host.sys / "devices/system/memory"
    assert [(memory / f"memory{n}/state").read_text() for n in (1, 2)] == ["online\n"] * 2
    assert _daemon(host, NoRebooter()).online_memory([]) == []  # policy "kernel": hands off


def test_backends(host: Layout, tmp_path: Path) -> None:
    """kured writes its sentinel; kexec loads the kernel it is given (the next boot's; here
    the running one) with kexec_file_load (``-s``, the call lockdown permits) then asks
    systemd to kexec."""
    sentinel = tmp_path / "run/reboot-required"
    KuredSentinel(sentinel).request("new generation pending for nvidia")
    assert sentinel.read_text() == "modstage: new generation pending for nvidia\n"
    calls: list[list[str]] = []
    kexec = BACKENDS["kexec"].commands
    assert kexec is not None
    release = RunningHost.read(host).need_release()
    CommandRebooter(lambda: kexec((), host, release), name="kexec", runner=calls.append).request(
        "x"
    )
    assert calls == [
        [
            "kexec",
            "-s",
            "-l",
            f"{host.root}/boot/vmlinuz-{release}",
            f"--initrd={host.root}/boot/initrd.img-{release}",
            "--reuse-cmdline",
        ],
        ["systemctl", "kexec"],
    ]


def test_idle_daemon_sleeps(host: Layout) -> None:
    """With nothing to do, the loop waits until its next deadline: over an hour it wakes for
    the heartbeat (30 s) and the rescan (300 s), never in between."""
    clock = FakeClock()
    daemon = _daemon(host, NoRebooter(), clock)
    clock.run_for(3600)
    daemon.loop()
    assert clock.mono - 1000.0 == 3600  # the hour passed through the daemon's waits
    assert len(clock.waits) <= 3600 / 30 + 3600 / 300 + 2, len(clock.waits)
    assert [w for w in clock.waits if w < 1.0] == [0.0]  # only the scan at start
    assert _scans(daemon) == 12  # at start and every 300 s until the hour ends: it went round


def test_the_system_clock_blocks_until_an_event_or_the_timeout() -> None:
    """The real wait sleeps on the queue: None after the timeout, an event as soon as queued."""
    events: queue.Queue[Event] = queue.Queue()
    started = time.monotonic()
    assert SystemClock().wait(events, 0.2) is None
    assert time.monotonic() - started >= 0.2
    threading.Timer(0.05, events.put, [Event(Kind.DROP, "x")]).start()
    got = SystemClock().wait(events, 30)
    assert got is not None and got.kind is Kind.DROP and time.monotonic() - started < 10


def test_hot_added_memory_alone_does_not_redecide_reboots(host: Layout) -> None:
    """A memory event between heartbeats onlines the block and goes back to listening: no
    reboot decision, no heartbeat (the next one comes on time)."""
    clock = FakeClock()
    daemon = _daemon(host, NoRebooter(), clock, hotplug_policy="online_movable")
    clock.run_for(1)
    daemon.loop()
    beat = host.heartbeat.stat().st_mtime_ns
    daemon.events.put(Event(Kind.MEMORY, "add memory2", at=clock.mono))
    clock.run_for(5)
    daemon.loop()
    block = host.sys / "devices/system/memory/memory2"
    assert (block / "state").read_text().strip() == "online"  # the kernel reads back "online"
    assert (block / "valid_zones").read_text().strip() == "Movable"
    assert host.heartbeat.stat().st_mtime_ns == beat
    clock.run_for(60)
    daemon.loop()
    assert host.heartbeat.stat().st_mtime_ns != beat  # the heartbeat did come


def test_a_device_event_refreshes_the_metrics_once_settled_and_redecides_nothing(
    host: Layout,
) -> None:
    """A PCI device bound, unbound, added or lost (the listener's DEVICES events) rewrites
    the metrics textfile, which reads the device view again, once the burst settles (not
    at each event), without a reboot decision or a heartbeat in between."""
    from service.daemon.timers import Timers

    clock = FakeClock()
    daemon = _daemon(host, NoRebooter(), clock)
    clock.run_for(1)
    daemon.loop()  # the first pass: scan, metrics, heartbeat
    beat = host.heartbeat.stat().st_mtime_ns
    host.metrics.unlink()
    timers = Timers.start(clock.mono, daemon.rescan_every, None)
    timers.dirty = None  # no scan due: only the events below
    burst = [Event(Kind.DEVICES, "add 0000:41:00.0"), Event(Kind.DEVICES, "bind 0000:41:00.0")]
    with capture_logs() as logs:
        daemon.step(burst, timers)
    assert timers.metrics == clock.mono + daemon.settle and not host.metrics.exists()
    assert [e["uevents"] for e in logs if e["event"] == "devices.changed"] == [
        ["add 0000:41:00.0", "bind 0000:41:00.0"]
    ]
    clock.mono += daemon.settle
    daemon.step([], timers)
    assert "modstage_health" in host.metrics.read_text() and timers.metrics is None
    assert host.heartbeat.stat().st_mtime_ns == beat


def test_a_module_unloaded_is_recorded_for_status_and_forgotten_when_back(
    host: Layout,
) -> None:
    """The listener's MODULES events: a ``remove`` records when the module left the kernel
    in /run/modstage/unloads.json (this boot's id), an ``add`` forgets it; the metrics are
    written again once the burst settles, and no reboot is decided for it."""
    from service.daemon.timers import Timers
    from service.status.unloads import read_unloads

    clock = FakeClock()
    daemon = _daemon(host, NoRebooter(), clock)
    clock.run_for(1)
    daemon.loop()
    host.boot_id.parent.mkdir(parents=True, exist_ok=True)
    host.boot_id.write_text("boot-9\n")
    timers = Timers.start(clock.mono, daemon.rescan_every, None)
    timers.dirty = None
    unload = [Event(Kind.MODULES, "remove nvidia_modeset"), Event(Kind.MODULES, "remove nvidia")]
    with capture_logs() as logs:
        daemon.step(unload, timers)
    at = clock.now().timestamp()
    assert read_unloads(host.unloads, "boot-9") == {"nvidia_modeset": at, "nvidia": at}
    assert [e["modules"] for e in logs if e["event"] == "modules.unloaded"] == [
        ["nvidia_modeset", "nvidia"]
    ]
    assert timers.metrics == clock.mono + daemon.settle
    daemon.step([Event(Kind.MODULES, "add nvidia")], timers)
    assert read_unloads(host.unloads, "boot-9") == {"nvidia_modeset": at}


def test_failing_backend_does_not_stop_the_daemon(
    host: Layout, module: Path, kernel: str, running: object
) -> None:
    """A reboot backend that fails is logged; the daemon keeps taking drops in."""
    from service.errors import RebootError

    def broken(argv: list[str]) -> None:
        raise RebootError("reboot-now: not found")

    daemon = _daemon(
        host,
        CommandRebooter(lambda: [["reboot-now"]], runner=broken),
        reboot=RebootConfig(backend="command", command=("x",), guard=Guard(0, 0)),
    )
    with capture_logs() as logs:
        running(daemon)  # type: ignore[operator]
        stage(
            host.incoming, bundle="test", version="1", kernel=kernel, modules=[ModuleSpec(module)]
        )
        _wait(lambda: host.state.exists() and load(host.state).reboot is not None)
        _wait(lambda: any(e["event"] == "daemon.step_failed" for e in logs))
        stage(
            host.incoming, bundle="test", version="2", kernel=kernel, modules=[ModuleSpec(module)]
        )
        _wait(
            lambda: (
                not list(host.incoming.iterdir())
                and load(host.state)
                .bundle("test")
                .generations[str(load(host.state).bundle("test").pending)]
                .version
                == "2"
            )
        )
    failed = [(e["step"], e["error"]) for e in logs if e["event"] == "daemon.step_failed"]
    assert failed and set(failed) == {("maybe_reboot", "reboot-now: not found")}, failed


def test_manifest_arriving_late_is_noticed_by_the_drop_watch(
    host: Layout, module: Path, kernel: str, running: object, tmp_path: Path
) -> None:
    """A drop whose manifest arrives after the daemon scanned it is taken in within the
    poll (incoming/ is watched, not each drop: while a drop directory waits for its
    manifest the loop rescans every second; the periodic rescan is 300 s away)."""
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    staged = stage(
        elsewhere, bundle="test", version="1", kernel=kernel, modules=[ModuleSpec(module)]
    )
    daemon = _daemon(host, NoRebooter())
    running(daemon)  # type: ignore[operator]
    target = host.incoming / staged.name
    shutil.copytree(staged, target, ignore=shutil.ignore_patterns("manifest.toml"))
    _wait(lambda: daemon.incomplete == 1)  # scanned, and found waiting
    (target / ".manifest.tmp").write_bytes((staged / "manifest.toml").read_bytes())
    (target / ".manifest.tmp").rename(target / "manifest.toml")
    _wait(
        lambda: host.state.exists() and load(host.state).bundle("test").pending is not None,
        timeout=5,
    )


def test_the_heartbeat_shows_the_decision_as_status_reads_it(host: Layout) -> None:
    """The typed decision becomes English only in the heartbeat: its text, ``requested`` when
    it was due (the daemon asked), ``error`` when the step failed before deciding."""
    from service.rebooting.window import Decision, Why

    clock = FakeClock()
    daemon = _daemon(host, NoRebooter(), clock)
    shown = []
    for decision in (Decision(Why.AFTER_DROP, left=12.4), Decision(Why.DUE), None):
        daemon.heartbeat(decision)
        shown.append(_decided(host))
        clock.advance(30)
    assert shown == ["waiting 12 s after the last drop", "requested", "error"]


def test_a_drop_waiting_for_its_manifest_is_taken_in_by_polling(
    host: Layout, module: Path, kernel: str, tmp_path: Path
) -> None:
    """A drop directory without its manifest (a stager still copying, or junk) raises no
    event when the manifest arrives (incoming/ is watched, not each drop), yet the drop is
    pending within a poll interval (1 s) of fake time, not at the periodic rescan 300 s
    later: while any drop directory waits for its manifest, the loop rescans every
    ``poll_incomplete`` seconds, and only then."""
    clock = FakeClock()
    daemon = _daemon(host, NoRebooter(), clock)
    # the observer is not started: no event can reach the loop, as none comes for a
    # manifest arriving in a drop; only the loop's own deadlines make it scan
    daemon.watcher = DropWatcher([host.incoming], daemon.events)
    junk = 4
    for i in range(junk):
        (host.incoming / f"junk.{i:020d}.{i:016x}").mkdir()
    (tmp_path / "elsewhere").mkdir()
    staged = stage(
        tmp_path / "elsewhere",
        bundle="test",
        version="1",
        kernel=kernel,
        modules=[ModuleSpec(module)],
    )
    drop = host.incoming / staged.name
    shutil.copytree(staged, drop, ignore=shutil.ignore_patterns("manifest.toml"))

    waiting_then: list[int] = []

    def manifest_arrives() -> None:
        waiting_then.append(daemon.incomplete)
        (drop / ".manifest.tmp").write_bytes((staged / "manifest.toml").read_bytes())
        (drop / ".manifest.tmp").rename(drop / "manifest.toml")

    arrives = clock.mono + 10.5  # between two polls, long after the scan at start
    clock.at(arrives, manifest_arrives)
    clock.run_for(arrives - clock.mono + daemon.poll_incomplete + 0.25)
    daemon.loop()
    assert waiting_then == [junk + 1]  # the junk and the drop were waiting
    assert load(host.state).bundle("test").phase is Phase.PENDING, "the drop was never polled"
    assert not drop.exists()
    assert daemon.incomplete == junk  # the junk keeps the loop polling
    assert _scans(daemon) >= 11  # at start, then about once a second of fake time


def test_no_polling_while_no_drop_waits_for_its_manifest(host: Layout, tmp_path: Path) -> None:
    """Without a drop directory that waits for its manifest the loop does not poll: over
    ten minutes of fake time it scans at start and at the 300 s rescans only, whatever
    else incoming/ holds (directories not named as drops, a symbolic link named as one)."""
    clock = FakeClock()
    daemon = _daemon(host, NoRebooter(), clock)
    daemon.watcher = DropWatcher([host.incoming], daemon.events)
    for i in range(300):
        (host.incoming / f"junk-{i}").mkdir()
    (host.incoming / "test.00000000000000000001.aa").symlink_to(tmp_path)
    clock.run_for(600)
    daemon.loop()
    assert daemon.incomplete == 0
    assert _scans(daemon) == 2  # at start and at 300 s; the one at 600 s is the stop


class _LostEvents(FileSystemEvent):
    """watchdog's lost-events report, as a release that has one dispatches it."""

    event_type = "lost"

    def __init__(self) -> None:
        super().__init__("")


def test_lost_events_make_the_loop_rescan_at_once(
    host: Layout, module: Path, kernel: str, tmp_path: Path
) -> None:
    """A drop arrives while the kernel's queue overflows (its event lost with the rest):
    where watchdog reports the loss, the loop, told by one OVERFLOW event, logs it and
    rescans at once (not at the periodic rescan 300 s later), and the drop is pending.
    (No watchdog release that Debian ships reports it: there the periodic rescan finds
    the drop, ``test_a_lost_drop_is_found_by_the_periodic_rescan``.)"""
    from service.daemon.timers import Timers

    clock = FakeClock()
    daemon = _daemon(host, NoRebooter(), clock)
    daemon.reconcile()
    daemon.take_drops()  # the scan at start: nothing yet
    scans = _scans(daemon)
    flood = tmp_path / "elsewhere"
    flood.mkdir()
    stage(flood, bundle="test", version="1", kernel=kernel, modules=[ModuleSpec(module)])
    (drop,) = flood.iterdir()
    drop.rename(host.incoming / drop.name)  # no watcher runs: its event is lost
    Handler(daemon.events, lost=_LostEvents).dispatch(_LostEvents())  # on watchdog's thread
    batch = daemon.next_batch(0.0)
    assert [e.kind for e in batch] == [Kind.OVERFLOW]
    timers = Timers.start(clock.mono, daemon.rescan_every, None)
    timers.dirty = None  # no scan due but for the events (a drop event alone: debounced)
    with capture_logs() as logs:
        daemon.step(batch, timers)
    assert any(e["event"] == "inotify.overflow" for e in logs), logs
    assert _scans(daemon) == scans + 1
    assert load(host.state).bundle("test").phase is Phase.PENDING


def test_a_lost_drop_is_found_by_the_periodic_rescan(
    host: Layout, module: Path, kernel: str, tmp_path: Path
) -> None:
    """A complete drop that raised no event (lost in an overflow no watchdog reported) is
    taken in at the periodic rescan (300 s of fake time), and not before: nothing polls
    while no drop waits for its manifest."""
    clock = FakeClock()
    daemon = _daemon(host, NoRebooter(), clock)
    daemon.watcher = DropWatcher([host.incoming], daemon.events)  # not started: no events
    (tmp_path / "elsewhere").mkdir()
    staged = stage(
        tmp_path / "elsewhere",
        bundle="test",
        version="1",
        kernel=kernel,
        modules=[ModuleSpec(module)],
    )
    seen: list[Phase | None] = []

    def lost_drop_arrives() -> None:
        staged.rename(host.incoming / staged.name)

    def before_the_rescan() -> None:
        seen.append(load(host.state).bundle("test").phase if host.state.exists() else None)

    clock.at(clock.mono + 10, lost_drop_arrives)
    clock.at(clock.mono + daemon.rescan_every - 1, before_the_rescan)
    clock.run_for(daemon.rescan_every + 1)
    daemon.loop()
    assert seen[0] is not Phase.PENDING
    assert load(host.state).bundle("test").phase is Phase.PENDING
    assert _scans(daemon) == 2  # at start and at the rescan

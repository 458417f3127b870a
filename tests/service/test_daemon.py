"""The daemon on a temporary root: real inotify, real files, recording reboot backends."""

from __future__ import annotations

import queue
import shutil
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from service.config import Config, RebootConfig
from service.daemon.events import DropWatcher, Event
from service.daemon.loop import Daemon
from service.layout import Layout
from service.reboot import CommandRebooter, KexecRebooter, KuredSentinel, NoRebooter
from service.store.intake import Intake
from service.store.records import RebootIntent
from service.store.state import Phase, load
from service.verify.trust import TrustStore
from service.window import Guard
from stager.drop import ModuleSpec, stage
from tests.kmod import SigningKey, sign
from tests.service.fakes import FakeKeyring, FakeSysfs, make_host


@pytest.fixture
def host(tmp_path: Path, kernel: str, rsa_key: SigningKey) -> Layout:
    """A host tree with two offline memory blocks."""
    return make_host(
        tmp_path / "root", kernel, rsa_key.cert_pem, {0: "online", 1: "offline", 2: "offline"}
    )


@pytest.fixture
def module(modules: dict[str, Path], rsa_key: SigningKey, tmp_path: Path) -> Path:
    """ms_params signed with the trusted key."""
    return sign(modules["ms_params"], rsa_key, tmp_path / "ms_params.ko")


def _daemon(host: Layout, rebooter: object, **config: object) -> Daemon:
    cfg = Config(**config)  # type: ignore[arg-type]
    intake = Intake(host, cfg, TrustStore.from_directory(host.trusted), FakeKeyring(set()))
    return Daemon(host, cfg, intake, rebooter, sysfs=FakeSysfs(host.sys))  # type: ignore[arg-type]


@pytest.fixture
def running(host: Layout) -> Iterator[list[Daemon]]:
    """Run a daemon's loop with a real inotify watcher in a thread; stop it afterwards."""
    started: list[Daemon] = []
    threads: list[threading.Thread] = []
    watchers: list[DropWatcher] = []

    def start(daemon: Daemon) -> None:
        watcher = DropWatcher(host.incoming, daemon.events)
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
        daemon.events.put(Event("stop"))
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
    rebooter = CommandRebooter(["reboot-now"], runner=asked.append)
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
    stage(host.incoming, bundle="test", version="2", kernel=kernel, modules=[ModuleSpec(module)])
    _wait(lambda: load(host.state).bundle("test").phase is Phase.PENDING)
    time.sleep(0.5)
    assert asked == [["reboot-now"]], "the guard allows one request per min_interval"


def test_incomplete_drop_is_left_alone(host: Layout, running: object) -> None:
    """A drop directory without its manifest is not touched by the daemon."""
    daemon = _daemon(host, NoRebooter())
    running(daemon)  # type: ignore[operator]
    partial = host.incoming / "test.00000000000000000001.ab"
    (partial / "modules").mkdir(parents=True)
    (partial / "modules" / "x.ko").write_bytes(b"half")
    time.sleep(1.0)
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

    from service.store.state import save

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
    done = daemon.online_memory([Event("memory", "add memory2"), Event("memory", "add memory9")])
    assert [(d["block"], d["state"]) for d in done] == [(2, "online_movable")]
    assert all(float(d["latency_ms"]) >= 0 for d in done)
    done = daemon.online_memory([])
    assert [(d["block"], d["state"]) for d in done] == [(1, "online_movable")]
    memory = host.sys / "devices/system/memory"
    assert [(memory / f"memory{n}/state").read_text() for n in (1, 2)] == ["online\n"] * 2
    assert _daemon(host, NoRebooter()).online_memory([]) == []  # policy "kernel": hands off


def test_backends(host: Layout, tmp_path: Path) -> None:
    """kured writes its sentinel; kexec loads the running kernel then asks systemd to kexec."""
    sentinel = tmp_path / "run/reboot-required"
    KuredSentinel(sentinel).request("new generation pending for nvidia")
    assert sentinel.read_text() == "modstage: new generation pending for nvidia\n"
    calls: list[list[str]] = []
    KexecRebooter(host, runner=calls.append).request("x")
    release = host.kernel_release()
    assert calls == [
        [
            "kexec",
            "-l",
            f"{host.root}/boot/vmlinuz-{release}",
            f"--initrd={host.root}/boot/initrd.img-{release}",
            "--reuse-cmdline",
        ],
        ["systemctl", "kexec"],
    ]


def test_idle_daemon_sleeps(host: Layout) -> None:
    """With nothing to do, the loop blocks on its queue (a handful of wakeups per second at most)."""

    class CountingQueue(queue.Queue[Event]):
        wakeups = 0

        def get(self, block: bool = True, timeout: float | None = None) -> Event:
            CountingQueue.wakeups += 1
            return super().get(block, timeout)

    daemon = _daemon(host, NoRebooter())
    daemon.events = CountingQueue()
    thread = threading.Thread(target=daemon.loop, daemon=True)
    thread.start()
    time.sleep(2.0)
    daemon.events.put(Event("stop"))
    thread.join(timeout=5)
    wakeups = CountingQueue.wakeups
    assert wakeups <= 3, wakeups


def test_failing_backend_does_not_stop_the_daemon(
    host: Layout, module: Path, kernel: str, running: object
) -> None:
    """A reboot backend that fails is logged; the daemon keeps taking drops in."""
    from service.errors import RebootError

    def broken(argv: list[str]) -> None:
        raise RebootError("reboot-now: not found")

    daemon = _daemon(
        host,
        CommandRebooter(["reboot-now"], runner=broken),
        reboot=RebootConfig(backend="command", command=("x",), guard=Guard(0, 0)),
    )
    running(daemon)  # type: ignore[operator]
    stage(host.incoming, bundle="test", version="1", kernel=kernel, modules=[ModuleSpec(module)])
    _wait(lambda: host.state.exists() and load(host.state).reboot is not None)
    stage(host.incoming, bundle="test", version="2", kernel=kernel, modules=[ModuleSpec(module)])
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


def test_manifest_arriving_late_is_noticed_by_the_drop_watch(
    host: Layout, module: Path, kernel: str, running: object, tmp_path: Path
) -> None:
    """A drop whose manifest arrives after the daemon scanned it is taken in at once (its
    directory is watched, not only incoming/; the periodic rescan is 300 s away)."""
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    staged = stage(
        elsewhere, bundle="test", version="1", kernel=kernel, modules=[ModuleSpec(module)]
    )
    daemon = _daemon(host, NoRebooter())
    running(daemon)  # type: ignore[operator]
    target = host.incoming / staged.name
    shutil.copytree(staged, target, ignore=shutil.ignore_patterns("manifest.toml"))
    _wait(lambda: daemon.watcher is not None and staged.name in daemon.watcher.drops)
    (target / ".manifest.tmp").write_bytes((staged / "manifest.toml").read_bytes())
    (target / ".manifest.tmp").rename(target / "manifest.toml")
    _wait(
        lambda: host.state.exists() and load(host.state).bundle("test").pending is not None,
        timeout=5,
    )


def test_drop_watches_are_capped(host: Layout) -> None:
    """However many drop directories a container makes, at most MAX_DROP_WATCHES are watched."""
    watcher = DropWatcher(host.incoming, queue.Queue())
    names = {f"test.{i:020d}.aa" for i in range(DropWatcher.MAX_DROP_WATCHES + 50)}
    for name in names:
        (host.incoming / name).mkdir()
    watcher.track(names)
    assert len(watcher.drops) == DropWatcher.MAX_DROP_WATCHES
    watcher.track(set())
    assert watcher.drops == {}

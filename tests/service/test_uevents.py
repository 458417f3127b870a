"""The daemon's uevent listener: its decisions per uevent, and blocks onlined on its own
thread, fed by a fake event source (the pyudev source is proved in the test VM)."""

from __future__ import annotations

import errno
import os
import queue
import socket
import threading
import time
from pathlib import Path

from structlog.testing import capture_logs

from service.daemon.events import Event, Kind
from service.daemon.uevents import (
    Overflow,
    Uevent,
    UeventListener,
    online_block,
    size_receive_buffer,
)
from service.host.sysfs import Sysfs
from stager.schema.manifest import MemoryPolicy

ADD = Uevent("add", "memory", "memory2")


class FakeSource:
    """A uevent source fed by the test: a pipe to wait on, a queue of uevents and losses."""

    def __init__(self) -> None:
        self._r, self._w = os.pipe()
        self._lock = threading.Lock()
        self._queued: list[Uevent | type[Overflow]] = []
        self.closed = False

    def send(self, *items: Uevent | type[Overflow]) -> None:
        """Queue uevents (or a loss) as the kernel would, all at once."""
        with self._lock:
            self._queued += items
        os.write(self._w, b"x")

    def fileno(self) -> int:
        return self._r

    def receive(self) -> Uevent | None:
        with self._lock:
            if not self._queued:
                os.read(self._r, 4096)  # drained: not readable until the next send
                return None
            item = self._queued.pop(0)
        if item is Overflow:
            raise Overflow
        assert isinstance(item, Uevent)
        return item

    def close(self) -> None:
        self.closed = True
        os.close(self._r)
        os.close(self._w)


def _sysfs(tmp_path: Path, states: dict[int, str]) -> Sysfs:
    memory = tmp_path / "devices/system/memory"
    for n, state in states.items():
        (memory / f"memory{n}").mkdir(parents=True)
        (memory / f"memory{n}/state").write_text(state + "\n")
    return Sysfs(tmp_path)


def _state(tmp_path: Path, n: int) -> str:
    return (tmp_path / f"devices/system/memory/memory{n}/state").read_text().strip()


def test_memory_adds_and_offlines_and_pci_changes_are_what_the_loop_hears() -> None:
    """A memory block's add or offline names it (MEMORY); a PCI device's add, remove, bind
    or unbind is a DEVICES event; a block's online (our own write), a PCI change event and
    another subsystem are nothing."""
    assert ADD.memory_block == 2
    assert ADD.event(5.0) == Event(Kind.MEMORY, "add memory2", at=5.0)
    assert Uevent("offline", "memory", "memory40").event(1.0) == Event(
        Kind.MEMORY, "offline memory40", at=1.0
    )
    for action in ("add", "remove", "bind", "unbind"):
        assert Uevent(action, "pci", "0000:41:00.0").event(2.0) == Event(
            Kind.DEVICES, f"{action} 0000:41:00.0", at=2.0
        )
    nothing = [
        Uevent("online", "memory", "memory40"),
        Uevent("change", "pci", "0000:41:00.0"),
        Uevent("add", "cpu", "cpu1"),
        Uevent("add", "memory", "auto_online_blocks"),
    ]
    assert [u.event(0.0) for u in nothing] == [None] * 4
    assert [u.memory_block for u in nothing] == [None] * 4


def test_a_module_unloaded_or_loaded_is_a_modules_event() -> None:
    """A kernel module's ``remove`` (``delete_module``) or ``add`` names it (MODULES); its
    ``change`` (a parameter written) is nothing."""
    assert Uevent("remove", "module", "nvidia_uvm").event(3.0) == Event(
        Kind.MODULES, "remove nvidia_uvm", at=3.0
    )
    assert Uevent("add", "module", "nvidia").event(4.0) == Event(Kind.MODULES, "add nvidia", at=4.0)
    assert Uevent("change", "module", "nvidia").event(4.0) is None


def test_uevent_of_a_pyudev_device_reads_action_subsystem_and_name() -> None:
    """Uevent.of takes what pyudev's Device says of the event: action, subsystem, sys_name."""

    class Device:
        action, subsystem, sys_name = "bind", "pci", "0000:00:04.0"

    assert Uevent.of(Device()) == Uevent("bind", "pci", "0000:00:04.0")


def test_an_added_block_is_onlined_on_the_listeners_thread_then_the_loop_hears(
    tmp_path: Path,
) -> None:
    """The listener writes the policy to the added block itself, logs it, and only then puts
    the block's event on the loop's queue; a device event is passed on; other uevents change
    nothing."""
    sysfs = _sysfs(tmp_path, {1: "online", 2: "offline", 3: "offline"})
    events: queue.Queue[Event] = queue.Queue()
    source = FakeSource()
    listener = UeventListener(sysfs, "online_movable", events, source=source)
    with capture_logs() as logs:
        listener.start()
        source.send(Uevent("add", "cpu", "cpu1"), ADD, Uevent("bind", "pci", "0000:00:04.0"))
        first, second = events.get(timeout=10), events.get(timeout=10)
        listener.stop()
    assert source.closed
    assert (first.kind, first.detail) == (Kind.MEMORY, "add memory2")
    assert (second.kind, second.detail) == (Kind.DEVICES, "bind 0000:00:04.0")
    assert _state(tmp_path, 2) == "online_movable" and _state(tmp_path, 3) == "offline"
    assert [(e["event"], e["block"]) for e in logs] == [("memory.onlined", 2)]
    assert events.empty()


def test_a_lost_message_makes_the_loop_walk_every_block_and_read_the_devices() -> None:
    """ENOBUFS (the source's Overflow) becomes a MEMORY event naming no block and a DEVICES
    event: the loop then walks every block and refreshes the device view; the uevents after
    it are handled as usual."""
    events: queue.Queue[Event] = queue.Queue()
    source = FakeSource()
    listener = UeventListener(Sysfs(Path("/nonexistent")), "kernel", events, source=source)
    listener.start()
    source.send(Overflow, ADD)
    got = [events.get(timeout=10) for _ in range(3)]
    listener.stop()
    assert [(e.kind, e.detail) for e in got] == [
        (Kind.MEMORY, "overflow: walk every block"),
        (Kind.DEVICES, "overflow: read the devices again"),
        (Kind.MEMORY, "add memory2"),
    ]


def test_the_kernel_policy_onlines_nothing_but_the_loop_still_hears(tmp_path: Path) -> None:
    """With ``hotplug_policy = "kernel"`` the loop hears of the block; the listener writes
    nothing and logs nothing."""
    sysfs = _sysfs(tmp_path, {2: "offline"})
    events: queue.Queue[Event] = queue.Queue()
    source = FakeSource()
    listener = UeventListener(sysfs, "kernel", events, source=source)
    with capture_logs() as logs:
        listener.start()
        source.send(ADD)
        assert events.get(timeout=10).detail == "add memory2"
        listener.stop()
    assert _state(tmp_path, 2) == "offline" and logs == []


def test_a_failing_source_is_logged_and_the_listener_goes_on(tmp_path: Path) -> None:
    """An error reading the source is logged (``memory.uevents_failed``) and the next uevent
    is still handled."""
    sysfs = _sysfs(tmp_path, {2: "offline"})
    events: queue.Queue[Event] = queue.Queue()

    class Flaky(FakeSource):
        failed = False

        def receive(self) -> Uevent | None:
            if not self.failed:
                self.failed = True
                raise OSError(5, "Input/output error")
            return super().receive()

    source = Flaky()
    listener = UeventListener(sysfs, "online", events, source=source)
    with capture_logs() as logs:
        listener.start()
        source.send(ADD)
        deadline = time.monotonic() + 10
        while not any(e["event"] == "memory.uevents_failed" for e in logs):
            assert time.monotonic() < deadline
            time.sleep(0.01)
        source.send(ADD)
        assert events.get(timeout=10).detail == "add memory2"
        listener.stop()
    assert _state(tmp_path, 2) == "online"


def test_one_block_is_onlined_as_the_policy_plans_it(tmp_path: Path) -> None:
    """online_block writes exactly the planned value (a shorter one too) and leaves an online
    block, a missing one and the offline policy alone."""
    sysfs = _sysfs(tmp_path, {1: "offline", 2: "online", 3: "offline"})
    [step] = online_block(sysfs, 1, MemoryPolicy.ONLINE, since=time.monotonic())
    assert step.state == "online" and step.latency_ms is not None and step.latency_ms >= 0
    assert _state(tmp_path, 1) == "online"
    assert online_block(sysfs, 2, MemoryPolicy.ONLINE_MOVABLE, since=0.0) == []
    assert online_block(sysfs, 9, MemoryPolicy.ONLINE_MOVABLE, since=0.0) == []
    assert online_block(sysfs, 3, MemoryPolicy.OFFLINE, since=0.0) == []


def test_starting_takes_memory_over_from_a_kernel_that_onlines_by_itself(
    tmp_path: Path,
) -> None:
    """With a policy, start sets ``auto_online_blocks`` from ``online`` to ``offline`` and
    moves a hot-pluggable block the kernel onlined into ZONE_NORMAL (offline, then the
    policy), both logged, before the thread listens; boot memory stays as it is."""
    from tests.service.fakes import FakeSysfs

    memory = tmp_path / "devices/system/memory"
    memory.mkdir(parents=True)
    (memory / "auto_online_blocks").write_text("online\n")
    for n, pluggable in ((1, False), (8, True)):
        (memory / f"memory{n}").mkdir()
        (memory / f"memory{n}/state").write_text("online\n")
        (memory / f"memory{n}/valid_zones").write_text("Normal\n")
        if pluggable:
            (memory / f"memory{n}/firmware_node").symlink_to(tmp_path)
    listener = UeventListener(
        FakeSysfs(tmp_path), "online_movable", queue.Queue(), source=FakeSource()
    )
    with capture_logs() as logs:
        listener.start()
        listener.stop()
    assert (memory / "auto_online_blocks").read_text() == "offline"
    assert (memory / "memory8/valid_zones").read_text().strip() == "Movable"
    assert (memory / "memory1/valid_zones").read_text().strip() == "Normal"
    assert [(e["event"], e.get("block"), e.get("moved_from")) for e in logs] == [
        ("memory.handed_over", None, None),
        ("memory.onlined", 8, "Normal"),
    ]


class _Monitor:
    """A monitor whose libudev sizing fails as it does without CAP_NET_ADMIN, over a real
    netlink socket (the kernel's own uevent family)."""

    def __init__(self, error: int) -> None:
        self.sock = socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, 15)  # NETLINK_KOBJECT_UEVENT
        self.error = error

    def set_receive_buffer_size(self, size: int) -> None:
        raise OSError(self.error, os.strerror(self.error))

    def fileno(self) -> int:
        return self.sock.fileno()


def test_without_cap_net_admin_the_buffer_is_sized_without_a_warning() -> None:
    """libudev's SO_RCVBUFFORCE refused (EPERM: no CAP_NET_ADMIN, as under the daemon's
    unit): the socket still gets SO_RCVBUF, as large as net.core.rmem_max allows (more than
    the default it had), logged as information, not a warning; the monitor's own socket
    stays open."""
    monitor = _Monitor(errno.EPERM)
    before = monitor.sock.getsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF)
    rmem_max = int(Path("/proc/sys/net/core/rmem_max").read_text())
    with capture_logs() as logs:
        got = size_receive_buffer(monitor, 1 << 24)
    assert got == monitor.sock.getsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF)
    assert got == min(2 * rmem_max, 2 * (1 << 24)) and got >= before
    assert [(e["event"], e["log_level"]) for e in logs] == [("uevents.buffer", "info")]
    monitor.sock.close()


def test_a_socket_that_takes_no_size_is_a_warning() -> None:
    """Any other failure of libudev's sizing (not a missing capability) is a warning."""
    monitor = _Monitor(errno.EBADF)
    with capture_logs() as logs:
        assert size_receive_buffer(monitor, 1 << 24) == 0
    assert [(e["event"], e["log_level"]) for e in logs] == [("uevents.buffer_unset", "warning")]
    monitor.sock.close()

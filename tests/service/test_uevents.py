"""The daemon's memory listener: kernel uevents parsed, blocks onlined on its own thread."""

from __future__ import annotations

import queue
import socket
import time
from pathlib import Path

from structlog.testing import capture_logs

from service.daemon.events import Event, Kind
from service.daemon.uevents import MemoryOnliner, Uevent, from_kernel
from service.kernel.sysfs import Sysfs

ADD = b"add@/devices/system/memory/memory2\0ACTION=add\0DEVPATH=/devices/system/memory/memory2\0"


def _sysfs(tmp_path: Path, states: dict[int, str]) -> Sysfs:
    memory = tmp_path / "devices/system/memory"
    for n, state in states.items():
        (memory / f"memory{n}").mkdir(parents=True)
        (memory / f"memory{n}/state").write_text(state + "\n")
    return Sysfs(tmp_path)


def _state(tmp_path: Path, n: int) -> str:
    return (tmp_path / f"devices/system/memory/memory{n}/state").read_text().strip()


def test_only_memory_adds_and_offlines_name_a_block() -> None:
    """A memory block's add or offline names it; its online (our own write), another
    subsystem, and udevd's re-sent messages name nothing."""
    assert Uevent.parse(ADD) == Uevent("add", "/devices/system/memory/memory2")
    assert Uevent.parse(ADD).memory_block == 2  # type: ignore[union-attr]
    offline = Uevent.parse(b"offline@/devices/system/memory/memory40\0")
    assert offline is not None and offline.memory_block == 40
    online = Uevent.parse(b"online@/devices/system/memory/memory40\0")
    assert online is not None and online.memory_block is None
    cpu = Uevent.parse(b"add@/devices/system/cpu/cpu1\0")
    assert cpu is not None and cpu.memory_block is None
    assert Uevent.parse(b"libudev\0\xfe\xed\xca\xfe") is None
    assert Uevent.parse(b"add@relative\0") is None


def test_only_the_kernel_is_a_trusted_sender() -> None:
    """Netlink port id 0 is the kernel; a user-space sender (any other port) is not."""
    assert from_kernel((0, 1))
    assert not from_kernel((4242, 1)) and not from_kernel(None) and not from_kernel("")


def test_an_added_block_is_onlined_on_the_listeners_thread_then_the_loop_hears(
    tmp_path: Path,
) -> None:
    """The listener writes the policy to the added block itself, logs it, and only then puts
    the block's event on the loop's queue; other uevents change nothing."""
    sysfs = _sysfs(tmp_path, {1: "online", 2: "offline", 3: "offline"})
    events: queue.Queue[Event] = queue.Queue()
    ours, kernel = socket.socketpair(socket.AF_UNIX, socket.SOCK_DGRAM)
    onliner = MemoryOnliner(sysfs, "online_movable", events, sock=ours, trusted=lambda _: True)
    with capture_logs() as logs:
        onliner.start()
        kernel.send(b"add@/devices/system/cpu/cpu1\0")
        kernel.send(ADD)
        event = events.get(timeout=10)
        onliner.stop()
    kernel.close()
    assert event.kind is Kind.MEMORY and event.detail == "add memory2"
    assert _state(tmp_path, 2) == "online_movable" and _state(tmp_path, 3) == "offline"
    assert [(e["event"], e["block"]) for e in logs] == [("memory.onlined", 2)]
    assert events.empty()


def test_an_untrusted_sender_and_the_kernel_policy_online_nothing(tmp_path: Path) -> None:
    """A message from user space is ignored; with ``hotplug_policy = "kernel"`` the loop
    still hears of the block but the listener writes nothing."""
    sysfs = _sysfs(tmp_path, {2: "offline"})
    events: queue.Queue[Event] = queue.Queue()
    ours, sender = socket.socketpair(socket.AF_UNIX, socket.SOCK_DGRAM)
    onliner = MemoryOnliner(sysfs, "online_movable", events, sock=ours)  # from_kernel
    onliner.start()
    sender.send(ADD)
    time.sleep(0.3)
    onliner.stop()
    assert events.empty() and _state(tmp_path, 2) == "offline"
    ours, kernel = socket.socketpair(socket.AF_UNIX, socket.SOCK_DGRAM)
    onliner = MemoryOnliner(sysfs, "kernel", events, sock=ours, trusted=lambda _: True)
    onliner.start()
    kernel.send(ADD)
    assert events.get(timeout=10).detail == "add memory2"
    onliner.stop()
    assert _state(tmp_path, 2) == "offline"
    sender.close()
    kernel.close()


def test_one_block_is_onlined_as_the_policy_plans_it(tmp_path: Path) -> None:
    """online_block writes exactly the planned value (a shorter one too) and leaves an online
    block, a missing one and the offline policy alone."""
    from service.daemon.uevents import online_block
    from stager.manifest import MemoryPolicy

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
    ours, kernel = socket.socketpair(socket.AF_UNIX, socket.SOCK_DGRAM)
    onliner = MemoryOnliner(
        FakeSysfs(tmp_path), "online_movable", queue.Queue(), sock=ours, trusted=lambda _: True
    )
    with capture_logs() as logs:
        onliner.start()
        onliner.stop()
    kernel.close()
    assert (memory / "auto_online_blocks").read_text() == "offline"
    assert (memory / "memory8/valid_zones").read_text().strip() == "Movable"
    assert (memory / "memory1/valid_zones").read_text().strip() == "Normal"
    assert [(e["event"], e.get("block"), e.get("moved_from")) for e in logs] == [
        ("memory.handed_over", None, None),
        ("memory.onlined", 8, "Normal"),
    ]

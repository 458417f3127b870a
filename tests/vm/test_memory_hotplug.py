"""Kernel truth: hot-added memory and `auto_online_blocks`, seen through sysfs and pyudev.

QEMU hot-adds a pc-dimm (`object-add memory-backend-ram` + `device_add pc-dimm` over QMP); the
guest's ACPI handler adds one `memoryN` block per block size, each raising a kernel `add` uevent.
Whether a new block comes up online, and in which zone, is decided by `auto_online_blocks` at
the moment it is added.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.vm.harness import Vm

pytestmark = pytest.mark.vm

MEMORY = "/sys/devices/system/memory"
DIMM = 512 << 20

# Runs in the guest agent: a kernel-source uevent monitor, started before the DIMM is added,
# and a wait for the new blocks that drains the monitor.
GUEST_HELPERS = """
import pyudev, time

def memory_blocks():
    return {n for n in os.listdir(MEMORY) if n.startswith("memory") and n[6:].isdigit()}

def start_monitor():
    monitor = pyudev.Monitor.from_netlink(pyudev.Context(), source="kernel")
    monitor.filter_by("memory")
    monitor.start()
    return monitor

def wait_for_blocks(monitor, before, count, timeout=60.0, quiet=2.0):
    # all blocks present and each seen added, then no memory uevent for `quiet` seconds
    deadline, events, new = time.monotonic() + timeout, [], set()
    last = time.monotonic()
    while time.monotonic() < deadline:
        device = monitor.poll(timeout=0.25)
        if device is not None:
            events.append((device.action, device.sys_name))
            last = time.monotonic()
        new = memory_blocks() - before
        added = {name for action, name in events if action == "add"}
        if len(new) >= count and new <= added and time.monotonic() - last > quiet:
            break
    return {name: read(f"{MEMORY}/{name}/state") for name in sorted(new)}, events
"""


@pytest.fixture(scope="module")
def blocks_per_dimm(vm: Vm) -> Iterator[int]:
    """Define the guest helpers; how many memory blocks one DIMM adds. Restores the policy."""
    vm.python(f"MEMORY = {MEMORY!r}\n{GUEST_HELPERS}")
    policy = vm.read(f"{MEMORY}/auto_online_blocks")
    yield DIMM // int(vm.read(f"{MEMORY}/block_size_bytes"), 16)
    vm.eval(f"write({MEMORY + '/auto_online_blocks'!r}, {policy!r})")


def hotplug(vm: Vm, policy: str, count: int) -> tuple[dict[str, str], dict[str, list[str]]]:
    """Set the policy, hot-add one DIMM; the new blocks' states, and uevents seen by action."""
    vm.eval(f"write({MEMORY + '/auto_online_blocks'!r}, {policy!r})")
    vm.python("monitor = start_monitor()\nbefore = memory_blocks()")
    vm.hotplug_memory(DIMM)
    states, events = vm.eval(f"wait_for_blocks(monitor, before, {count})", timeout=90)
    by_action: dict[str, list[str]] = {}
    for action, name in events:
        by_action.setdefault(action, []).append(name)
    return dict(states), {action: sorted(names) for action, names in by_action.items()}


def test_hot_added_blocks_stay_offline_by_default(vm: Vm, blocks_per_dimm: int) -> None:
    """Debian's boot-time policy is `offline`; blocks hot-added under it come up offline.

    pyudev's kernel-source monitor sees one `add` event per new block, and nothing else.
    """
    assert vm.read(f"{MEMORY}/auto_online_blocks") == "offline"
    states, events = hotplug(vm, "offline", blocks_per_dimm)
    assert len(states) == blocks_per_dimm
    assert set(states.values()) == {"offline"}
    assert events == {"add": sorted(states)}


def test_hot_added_blocks_follow_online_movable(vm: Vm, blocks_per_dimm: int) -> None:
    """With `auto_online_blocks=online_movable`, new blocks come up online in ZONE_MOVABLE.

    The monitor sees each block's `add` and then its `online` event.
    """
    states, events = hotplug(vm, "online_movable", blocks_per_dimm)
    assert len(states) == blocks_per_dimm
    assert set(states.values()) == {"online"}
    assert events == {"add": sorted(states), "online": sorted(states)}
    zones = {vm.read(f"{MEMORY}/{block}/valid_zones") for block in states}
    assert zones == {"Movable"}

"""Kernel truth: hot-added memory and `auto_online_blocks`, seen through sysfs and pyudev;
and modstage's policy holding on a kernel that onlines hot-added memory by itself.

QEMU hot-adds a pc-dimm (`object-add memory-backend-ram` + `device_add pc-dimm` over QMP); the
guest's ACPI handler adds one `memoryN` block per block size, each raising a kernel `add` uevent.
Whether a new block comes up online, and in which zone, is decided by `auto_online_blocks` at
the moment it is added. The kernels differ there: Debian 12's 6.1 boots with `offline`,
Debian 13's 6.12 with `online` (`CONFIG_MHP_DEFAULT_ONLINE_TYPE_ONLINE_AUTO=y`), which puts a
hot-added block in ZONE_NORMAL before any uevent. One node per kernel, four DIMMs of 512 MiB.
"""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest

from tests.vm.harness import Vm
from tests.vm.harness.kernel import AUTO_ONLINE_AT_BOOT, Kernel

pytestmark = [pytest.mark.vm, pytest.mark.kernels("6.1", "6.12", "7.2")]

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


def test_hot_added_blocks_follow_each_kernels_boot_policy(
    vm: Vm, kernel: Kernel, blocks_per_dimm: int
) -> None:
    """6.1 boots with `offline`: hot-added blocks come up offline, one `add` uevent each.
    6.12 boots with `online`: they come up online in ZONE_NORMAL, each with `add` and then
    `online` (the kernel onlined them itself, before user space heard of them)."""
    policy = AUTO_ONLINE_AT_BOOT[kernel.series]
    assert vm.read(f"{MEMORY}/auto_online_blocks") == policy
    states, events = hotplug(vm, policy, blocks_per_dimm)
    assert len(states) == blocks_per_dimm
    if policy == "offline":
        assert set(states.values()) == {"offline"}
        assert events == {"add": sorted(states)}
    else:
        assert set(states.values()) == {"online"}
        assert events == {"add": sorted(states), "online": sorted(states)}
        assert {vm.read(f"{MEMORY}/{block}/valid_zones") for block in states} == {"Normal"}


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


def test_modstage_moves_blocks_the_kernel_onlined_before_its_policy_or_reports_them(
    vm: Vm, blocks_per_dimm: int
) -> None:
    """A DIMM hot-added while `auto_online_blocks` is `online` (6.12's boot default, set
    by hand on 6.1) lands in ZONE_NORMAL. modstage's boot step for a bundle asking for
    `online_movable` (`apply_policy`, as `modstage boot` calls it) sets the policy and moves
    every hot-pluggable block in ZONE_NORMAL (this DIMM's, and on 6.12 the first test's):
    offlined, onlined movable. A block the kernel has put unmovable pages in by then (seen
    on both kernels: `EBUSY`) stays online where it is, its step carries the kernel's words,
    and the status check (`misplaced_memory`, what `modstage status` reports) names exactly
    those blocks. Most of the new DIMM moves. Boot memory (no `firmware_node`) is left
    exactly as it was; the DIMM's blocks carry the link the move relies on."""
    boot_blocks = vm.eval(
        "{n: [read(f'{MEMORY}/{n}/state'), read(f'{MEMORY}/{n}/valid_zones')]"
        " for n in memory_blocks() if not os.path.exists(f'{MEMORY}/{n}/firmware_node')}"
    )
    states, _ = hotplug(vm, "online", blocks_per_dimm)
    assert set(states.values()) == {"online"}
    assert {vm.read(f"{MEMORY}/{block}/valid_zones") for block in states} == {"Normal"}
    assert all(vm.eval(f"os.path.exists({MEMORY + '/' + b + '/firmware_node'!r})") for b in states)
    misplaced_before = vm.eval(
        "sorted(n for n in memory_blocks() if os.path.exists(f'{MEMORY}/{n}/firmware_node')"
        " and read(f'{MEMORY}/{n}/state') == 'online'"
        " and read(f'{MEMORY}/{n}/valid_zones') == 'Normal')"
    )
    out = vm.python(
        "import json\n"
        "from pathlib import Path\n"
        "from service.config import Config\n"
        "from service.host.memory import apply_policy\n"
        "from service.host.sysfs import Sysfs\n"
        "from service.layout import Layout\n"
        "from service.status.hardware import misplaced_memory\n"
        "from service.bundles.state import State\n"
        "from stager.schema.manifest import MemoryPolicy\n"
        "done = apply_policy(Sysfs(Path('/sys')), MemoryPolicy.ONLINE_MOVABLE)\n"
        "host = Config(hotplug_policy='online_movable')\n"
        "problems = [p.reason for p in misplaced_memory(Layout(Path('/')), State(), host)]\n"
        "print(json.dumps([[d.fields() for d in done], problems]))",
        timeout=120,
    )
    done, problems = json.loads(out.strip().splitlines()[-1])
    assert done[0] == {"auto_online_blocks": "online_movable"}
    moves = {f"memory{d['block']}": d for d in done[1:] if d.get("moved_from") == "Normal"}
    assert sorted(moves) == sorted(misplaced_before), done
    stuck = sorted(name for name, d in moves.items() if "error" in d)
    for name in misplaced_before:
        zone = vm.read(f"{MEMORY}/{name}/valid_zones")
        assert vm.read(f"{MEMORY}/{name}/state") == "online"
        assert zone == ("Normal" if name in stuck else "Movable"), (name, moves[name])
    for name in stuck:
        assert moves[name]["error"].startswith("cannot offline it to move it: "), moves[name]
    assert len(set(states) - set(stuck)) >= blocks_per_dimm // 2, done
    if stuck:
        [reason] = problems
        listed = sorted(w.split(" ")[0] for w in reason.split(": ", 1)[1].split(", "))
        assert listed == stuck, (reason, stuck)
    else:
        assert problems == []
    after = vm.eval(
        f"{{n: [read(f'{{MEMORY}}/{{n}}/state'), read(f'{{MEMORY}}/{{n}}/valid_zones')]"
        f" for n in {sorted(boot_blocks)!r}}}"
    )
    assert after == boot_blocks


def test_the_daemons_listener_takes_hot_added_memory_over_from_the_kernel(
    vm: Vm, blocks_per_dimm: int
) -> None:
    """With `auto_online_blocks` at `online` (6.12's default), the daemon's uevent listener
    (pyudev's kernel-source monitor, no udevd) with `hotplug_policy = "online_movable"` sets
    it to `offline` when it starts, so the next DIMM's blocks reach it offline and it onlines
    each movable (one `memory.onlined` step per block, none failed), and tells the loop of
    each added block (one `add memoryN` event per block on its queue)."""
    vm.eval(f"write({MEMORY + '/auto_online_blocks'!r}, 'online')")
    vm.python(
        "import queue\n"
        "from pathlib import Path\n"
        "from service.daemon.uevents import KernelUevents, UeventListener\n"
        "from service.host.sysfs import Sysfs\n"
        "heard = queue.Queue()\n"
        "listener = UeventListener(Sysfs(Path('/sys')), 'online_movable', heard)\n"
        "assert isinstance(listener.source, KernelUevents)\n"
        "listener.start()"
    )
    try:
        assert vm.read(f"{MEMORY}/auto_online_blocks") == "offline"
        vm.python("monitor = start_monitor()\nbefore = memory_blocks()")
        vm.hotplug_memory(DIMM)
        states, events = vm.eval(f"wait_for_blocks(monitor, before, {blocks_per_dimm})", timeout=90)
    finally:
        vm.python("listener.stop()")
    told = vm.eval("[heard.get_nowait().detail for _ in range(heard.qsize())]")
    assert len(states) == blocks_per_dimm
    assert set(states.values()) == {"online"}
    assert {vm.read(f"{MEMORY}/{block}/valid_zones") for block in states} == {"Movable"}
    added = sorted(name for action, name in events if action == "add")
    assert added == sorted(states)
    assert sorted(d.removeprefix("add ") for d in told if d.startswith("add ")) == added

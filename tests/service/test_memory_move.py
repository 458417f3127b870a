"""Memory the kernel onlined before the policy was set: moved when it can be, reported when not.

The sysfs is ``tests/service/fakes.FakeSysfs`` (the kernel's answers to state writes, checked
against a real kernel by ``tests/contract``); a block of a hot-pluggable memory device carries
the ``firmware_node`` link the kernel gives it (``acpi_bind_memory_blocks``).
"""

from __future__ import annotations

import errno
import os
import time
from pathlib import Path

from service.bundles.state import State
from service.config import Config
from service.host.memory import MEMORY, Onlined, apply_policy, hand_over, misplaced
from service.host.sysfs import Sysfs
from service.layout import Layout
from service.status.hardware import misplaced_memory
from service.status.health import Health
from stager.schema.manifest import MemoryPolicy
from tests.service.fakes import FakeSysfs


def node(root: Path, blocks: dict[int, tuple[str, str, bool]], auto: str = "online") -> None:
    """A memory tree: block -> (state, valid_zones, hot-pluggable)."""
    base = root / MEMORY
    base.mkdir(parents=True)
    (base / "auto_online_blocks").write_text(auto + "\n")
    for n, (state, zones, pluggable) in blocks.items():
        (base / f"memory{n}").mkdir()
        (base / f"memory{n}/state").write_text(state + "\n")
        (base / f"memory{n}/valid_zones").write_text(zones + "\n")
        if pluggable:
            (base / f"memory{n}/firmware_node").symlink_to(root)


class Unmovable(FakeSysfs):
    """The kernel's answer for a block holding unmovable pages: offlining it fails with
    ``EBUSY`` (``offline_pages`` in mm/memory_hotplug.c, after migration gives up)."""

    busy = frozenset({9})

    def write(self, attribute: str, value: str) -> bool:
        block = attribute.rsplit("/", 2)[-2]
        if value == "offline" and block in {f"memory{n}" for n in self.busy}:
            raise OSError(errno.EBUSY, os.strerror(errno.EBUSY), attribute)
        return super().write(attribute, value)


class Stuck(FakeSysfs):
    """Offlining that keeps retrying (the kernel loops until a signal is pending)."""

    def write(self, attribute: str, value: str) -> bool:
        if value == "offline":
            time.sleep(30)
        return super().write(attribute, value)


def zones(root: Path) -> dict[int, str]:
    sysfs = Sysfs(root)
    return {
        int(n[6:]): f"{sysfs.read(f'{MEMORY}/{n}/state')}/{sysfs.read(f'{MEMORY}/{n}/valid_zones')}"
        for n in sysfs.entries(MEMORY)
        if n.startswith("memory")
    }


def test_misplaced_hot_added_blocks_are_moved_and_boot_memory_is_never_touched(
    tmp_path: Path,
) -> None:
    """Under ``online_movable`` the setting is written first, an offline block is onlined
    movable, and each hot-pluggable block the kernel put in ZONE_NORMAL is offlined and
    onlined movable, highest first; boot memory (no firmware node) in ZONE_NORMAL and a
    block already in ZONE_MOVABLE stay as they are."""
    node(
        tmp_path,
        {
            0: ("online", "DMA32", False),
            1: ("online", "Normal", False),
            8: ("online", "Normal", True),
            9: ("online", "Normal", True),
            10: ("online", "Movable", True),
            11: ("offline", "Normal Movable", True),
        },
    )
    done = apply_policy(FakeSysfs(tmp_path), MemoryPolicy.ONLINE_MOVABLE)
    assert done[0] == Onlined(None, "online_movable")
    assert [(d.block, d.state, d.moved_from, d.error) for d in done[1:]] == [
        (11, "online_movable", None, None),
        (9, "online_movable", "Normal", None),
        (8, "online_movable", "Normal", None),
    ]
    assert Sysfs(tmp_path).read(f"{MEMORY}/auto_online_blocks") == "online_movable"
    assert zones(tmp_path) == {
        0: "online/DMA32",
        1: "online/Normal",
        8: "online/Movable",
        9: "online/Movable",
        10: "online/Movable",
        11: "online/Movable",
    }
    assert apply_policy(FakeSysfs(tmp_path), MemoryPolicy.ONLINE_MOVABLE) == []


def test_online_kernel_moves_blocks_out_of_the_movable_zone_and_online_names_no_zone(
    tmp_path: Path,
) -> None:
    """``online_kernel`` moves a hot-pluggable block out of ZONE_MOVABLE; ``online`` and
    ``offline`` name no zone, so nothing is misplaced under them."""
    node(tmp_path, {8: ("online", "Movable", True), 9: ("online", "Normal", True)})
    sysfs = FakeSysfs(tmp_path)
    assert misplaced(sysfs, MemoryPolicy.ONLINE) == []
    assert misplaced(sysfs, MemoryPolicy.OFFLINE) == []
    assert [b.number for b in misplaced(sysfs, MemoryPolicy.ONLINE_KERNEL)] == [8]
    done = apply_policy(sysfs, MemoryPolicy.ONLINE_KERNEL)
    assert [(d.block, d.moved_from, d.error) for d in done[1:]] == [(8, "Movable", None)]
    assert zones(tmp_path) == {8: "online/Normal", 9: "online/Normal"}


def test_a_block_that_cannot_be_offlined_stays_and_is_reported_by_status(tmp_path: Path) -> None:
    """EBUSY on offlining leaves the block online where it is, the step carries the
    kernel's words, the other block still moves, and ``status`` names the block as
    misplaced against the host's hotplug_policy (degraded)."""
    node(tmp_path, {8: ("online", "Normal", True), 9: ("online", "Normal", True)})
    done = apply_policy(Unmovable(tmp_path), MemoryPolicy.ONLINE_MOVABLE)
    assert [(d.block, d.error) for d in done[1:]] == [
        (9, f"cannot offline it to move it: {os.strerror(errno.EBUSY)}"),
        (8, None),
    ]
    assert done[1].fields()["moved_from"] == "Normal"
    assert zones(tmp_path) == {8: "online/Movable", 9: "online/Normal"}
    layout = Layout(tmp_path / "root")
    (layout.sys / "devices/system").mkdir(parents=True)
    (layout.sys / MEMORY).symlink_to(tmp_path / MEMORY)
    host = Config(hotplug_policy="online_movable")
    [problem] = misplaced_memory(layout, State(), host)
    assert problem.bundle is None and problem.health is Health.DEGRADED
    assert "memory9 (Normal)" in problem.reason and "online_movable" in problem.reason
    assert "memory8" not in problem.reason
    assert misplaced_memory(layout, State(), Config()) == []


def test_offlining_that_does_not_finish_is_given_up_after_the_timeout(tmp_path: Path) -> None:
    """A block whose offlining keeps retrying is given up after the timeout (the alarm
    interrupts the write) and reported; the block is left online."""
    node(tmp_path, {8: ("online", "Normal", True)})
    started = time.monotonic()
    done = apply_policy(Stuck(tmp_path), MemoryPolicy.ONLINE_MOVABLE, offline_timeout=0.2)
    assert time.monotonic() - started < 5
    assert [(d.block, d.error) for d in done[1:]] == [
        (8, "cannot offline it to move it: timed out")
    ]
    assert zones(tmp_path) == {8: "online/Normal"}


def test_hand_over_turns_the_kernels_own_onlining_off_and_keeps_a_chosen_setting(
    tmp_path: Path,
) -> None:
    """``online`` (Debian 13's boot default) becomes ``offline``, so the daemon onlines
    hot-added blocks; a setting someone chose (``online_movable``) is kept."""
    node(tmp_path, {})
    sysfs = FakeSysfs(tmp_path)
    assert hand_over(sysfs) is True
    assert sysfs.read(f"{MEMORY}/auto_online_blocks") == "offline"
    assert hand_over(sysfs) is False
    sysfs.write(f"{MEMORY}/auto_online_blocks", "online_movable")
    assert hand_over(sysfs) is False
    assert sysfs.read(f"{MEMORY}/auto_online_blocks") == "online_movable"
    assert hand_over(Sysfs(tmp_path / "absent")) is False


def test_a_callers_own_alarm_survives_the_offline_deadline(tmp_path: Path) -> None:
    """A caller's pending SIGALRM timer is re-armed after a move (the test bed's agent
    bounds every request with one): what is left of it, not cancelled."""
    import signal

    node(tmp_path, {8: ("online", "Normal", True)})
    fired: list[int] = []
    previous = signal.signal(signal.SIGALRM, lambda signum, frame: fired.append(signum))
    try:
        signal.setitimer(signal.ITIMER_REAL, 30)
        apply_policy(FakeSysfs(tmp_path), MemoryPolicy.ONLINE_MOVABLE)
        left = signal.getitimer(signal.ITIMER_REAL)[0]
        assert 25 < left <= 30
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
    assert fired == []
    assert zones(tmp_path) == {8: "online/Movable"}

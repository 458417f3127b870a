"""Kernel truth for node reboots: the state share persists, the boot id does not."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.vm.harness import GUEST_STATE_DIR, Vm, VmFactory

pytestmark = [pytest.mark.vm, pytest.mark.kernels("6.1", "6.12")]


@pytest.fixture(scope="module")
def node(boot_vm: VmFactory) -> Iterator[Vm]:
    """A node of its own, since these tests reboot it."""
    vm = boot_vm("rebooting")
    yield vm
    vm.close()


def test_state_share_survives_a_reboot_and_boot_id_changes(node: Vm) -> None:
    """A file written on /var/lib/modstage in boot 1 is there in boot 2; boot_id differs.

    The guest writes the file (through 9p, onto the host directory); the guest then reboots,
    which ends qemu, and the harness boots the same state share again.
    """
    marker = f"{GUEST_STATE_DIR}/boot1.txt"
    first = node.read("/proc/sys/kernel/random/boot_id")
    node.eval(f"write({marker!r}, {first!r})")
    assert (node.state_dir / "boot1.txt").read_text() == first

    node.reboot()

    second = node.read("/proc/sys/kernel/random/boot_id")
    assert node.boots == 2
    assert second != first
    assert node.boot_id == second
    assert node.read(marker) == first


def test_reboot_can_change_the_kernel_command_line(node: Vm) -> None:
    """`reboot(kernel_args=...)` boots the same node with other arguments (a bootloader change)."""
    node.reboot(kernel_args=["modstage.test=42"])
    assert "modstage.test=42" in node.read("/proc/cmdline").split()
    assert (node.state_dir / "boot1.txt").exists()

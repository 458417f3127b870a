"""``lock_modules`` on a real kernel: after ``modstage boot`` loaded the bundle, the kernel
refuses every module load until the next reboot, and ``status`` shows the lock.

Control: ``kernel.modules_disabled`` is 0 before the boot and the bundle's module loads.
Then an ``insmod`` of another signed test module and a ``modprobe`` of an in-tree module
(``dummy``) both fail with the kernel's ``EPERM`` ("Operation not permitted")."""

from __future__ import annotations

from pathlib import Path

import pytest

from service.bundles.phase import Phase
from tests.kmod import SigningKey, make_key
from tests.vm.harness import Vm, VmFactory, kmod
from tests.vm.harness.kernel import Kernel
from tests.vm.node import drop, live_modules, modstage, prepare, state

pytestmark = [pytest.mark.vm, pytest.mark.kernels("6.1", "6.12")]


@pytest.fixture(scope="module")
def key(tmp_path_factory: pytest.TempPathFactory) -> SigningKey:
    """The driver vendor's key, trusted by the node."""
    return make_key(tmp_path_factory.mktemp("lock-vendor"), "rsa4096", cn="vendor key")


def test_the_kernel_refuses_every_module_load_after_a_locking_boot(
    boot_vm: VmFactory,
    kernel: Kernel,
    test_modules: dict[str, Path],
    key: SigningKey,
    tmp_path: Path,
) -> None:
    """The module docstring's steps, on the node."""
    signed = {
        n: kmod.sign(kernel, test_modules[n], key, tmp_path / f"{n}.ko")
        for n in ("ms_exporter", "ms_params")
    }
    node: Vm = boot_vm("lock")
    prepare(node, {"vendor.pem": key.cert_pem.read_bytes()}, "lock_modules = true\n")
    assert node.read("/proc/sys/kernel/modules_disabled").strip() == "0"
    drop(node, "demo", "1", kernel.release, [(signed["ms_exporter"], "")])
    assert modstage(node, "intake")[0] == 0
    rc, out = modstage(node, "boot", replay_boot=False)
    assert rc == 0 and "modules: locked until the next reboot" in out, out
    assert state(node).bundle("demo").phase is Phase.ACTIVE and "ms_exporter" in live_modules(node)
    assert node.read("/proc/sys/kernel/modules_disabled").strip() == "1"
    (node.state_dir / "ms_params.ko").write_bytes(signed["ms_params"].read_bytes())  # the share
    insmod = node.run(["insmod", "/var/lib/modstage/ms_params.ko"])
    assert insmod.rc != 0 and "Operation not permitted" in insmod.stderr, insmod
    probe = node.run(["modprobe", "dummy"])
    assert probe.rc != 0 and "Operation not permitted" in probe.stderr, probe
    assert "ms_params" not in live_modules(node) and "dummy" not in live_modules(node)
    _, out = modstage(node, "status")
    assert "modules: locked until the next reboot (kernel.modules_disabled = 1)" in out, out

"""A vendor-signed module named like one of the guest kernel's own in-tree modules, on a real
kernel: refused at intake by default; with ``[bundles.<name>] shadow_in_tree`` naming it,
``modstage boot`` loads it and it takes the name, so the kernel's own module no longer loads,
and ``status`` says it shadows the in-tree one.

The module is a trivial one built as ``dummy`` against the guest kernel's headers: Debian's
kernels have ``kernel/drivers/net/dummy.ko`` (not loaded at boot in the test guest), whose
taint in ``/sys/module/dummy/taint`` is empty, where the vendor's, built out of tree, taints
``O`` (and ``E``: the guest's kernel does not hold the test key). Control: before anything is staged, ``modprobe dummy`` loads the kernel's own (no
taint); it is removed again.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest

from service.bundles.phase import Phase
from tests.kmod import SigningKey, make_key
from tests.kmod.build import cache_root
from tests.vm.harness import Vm, VmFactory, kmod
from tests.vm.harness.kernel import Kernel
from tests.vm.node import drop, live_modules, modstage, prepare, state, status

pytestmark = [pytest.mark.vm, pytest.mark.kernels("6.1", "6.12")]

SOURCE = b"""\
#include <linux/module.h>
static int __init shadow_init(void) { return 0; }
static void __exit shadow_exit(void) { }
module_init(shadow_init);
module_exit(shadow_exit);
MODULE_LICENSE("GPL");
MODULE_DESCRIPTION("modstage test: a vendor module named like the kernel's dummy");
"""
TAINT = "/sys/module/dummy/taint"


def build_dummy(kernel: Kernel) -> Path:
    """The vendor's ``dummy.ko``, unsigned, built against ``kernel``'s headers (cached)."""
    key = hashlib.sha256(SOURCE + kernel.release.encode()).hexdigest()[:16]

    def fill(work: Path) -> None:
        (work / "dummy.c").write_bytes(SOURCE)
        (work / "Kbuild").write_text("obj-m := dummy.o\n")

    final = kmod.build_tree(kernel, cache_root() / f"shadow-{kernel.release}-{key}", fill)
    return final / "dummy.ko"


@pytest.fixture(scope="module")
def key(tmp_path_factory: pytest.TempPathFactory) -> SigningKey:
    """The vendor's key, trusted by the node."""
    return make_key(tmp_path_factory.mktemp("shadow-vendor"), "rsa4096", cn="vendor key")


def test_a_module_named_like_an_in_tree_one_is_refused_unless_the_bundle_may_shadow_it(
    boot_vm: VmFactory, kernel: Kernel, key: SigningKey, tmp_path: Path
) -> None:
    """The module docstring's steps, on the node."""
    signed = kmod.sign(kernel, build_dummy(kernel), key, tmp_path / "dummy.ko")
    node: Vm = boot_vm("shadow")
    in_tree = f"/lib/modules/{kernel.release}/kernel/drivers/net/dummy.ko"
    assert "dummy" not in live_modules(node)
    probe = node.run(["modprobe", "dummy"])  # the control: the kernel's own loads
    assert probe.rc == 0 and node.read(TAINT).strip() == "", probe
    assert node.run(["rmmod", "dummy"]).rc == 0 and "dummy" not in live_modules(node)

    prepare(node, {"vendor.pem": key.cert_pem.read_bytes()})
    drop(node, "demo", "1", kernel.release, [(signed, "")])
    rc, out = modstage(node, "intake")
    assert rc != 0, out
    [error] = status(node, "demo")["errors"]
    assert error.startswith(
        f"modules/dummy.ko: module dummy would take the place of the target kernel's in-tree "
        f"module {in_tree}"
    ), error
    assert state(node).bundle("demo").pending is None

    prepare(
        node,
        {"vendor.pem": key.cert_pem.read_bytes()},
        '[bundles.demo]\nshadow_in_tree = ["dummy"]\n',
    )
    drop(node, "demo", "1", kernel.release, [(signed, "")])
    rc, out = modstage(node, "intake")
    assert rc == 0, out
    rc, out = modstage(node, "boot")
    assert rc == 0 and state(node).bundle("demo").phase is Phase.ACTIVE, out
    assert "dummy" in live_modules(node)
    assert "O" in node.read(TAINT)  # the vendor's, not the kernel's
    node.run(["modprobe", "dummy"])  # finds the name taken: the kernel's own never loads
    assert "O" in node.read(TAINT)
    rc, out = modstage(node, "status")
    shadow = "modules/dummy.ko shadows the in-tree kernel/drivers/net/dummy.ko"  # .xz on 6.12
    assert shadow in out, out

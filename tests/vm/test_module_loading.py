"""Kernel truth: how finit_module treats signed test modules without enforcement.

These run on the shared node (no `module.sig_enforce`), where a module signed with a key the
kernel does not know still loads but taints the kernel.
"""

from __future__ import annotations

import errno
from pathlib import Path

import pytest

from tests.vm.harness import Vm
from tests.vm.harness.kernel import Kernel

pytestmark = [pytest.mark.vm, pytest.mark.kernels("6.1", "6.12", "7.2")]

TAINT_OOT_MODULE = 1 << 12  # O
TAINT_UNSIGNED_MODULE = 1 << 13  # E
MODULE_INIT_COMPRESSED_FILE = 4


def load(vm: Vm, module: Path, params: str = "") -> int:
    """Put `module` on the state share and finit_module it; 0 or the errno."""
    path = vm.put(module, f"kmod/{module.name}")
    return int(vm.eval(f"finit_module({path!r}, {params!r})"))


def unload_if_live(vm: Vm, name: str) -> None:
    """Unload ``name`` if an earlier test on the shared node left it loaded."""
    if vm.eval(f"os.path.isdir('/sys/module/{name}')"):
        assert int(vm.eval(f"delete_module({name!r})")) == 0


def test_signed_module_loads_with_parameters(vm: Vm, signed_modules: dict[str, Path]) -> None:
    """finit_module of a test-key-signed module succeeds and its parameters show in sysfs.

    The key is not in the kernel's keyring, so the load taints the kernel as unsigned (E) and
    out-of-tree (O) instead of failing. Checked on the module itself
    (``/sys/module/ms_params/taint``, the flags this load set), not only on the kernel's
    sticky ``tainted``, which an earlier load on the shared node may have set already.
    """
    unload_if_live(vm, "ms_params")
    assert load(vm, signed_modules["ms_params"], 'count=7 label="hello world"') == 0
    parameters = "/sys/module/ms_params/parameters"
    assert vm.read(f"{parameters}/count") == "7"
    assert vm.read(f"{parameters}/label") == "hello world"
    assert vm.read("/sys/module/ms_params/taint") == "OE"  # in taint_flags order: O, then E
    tainted = int(vm.read("/proc/sys/kernel/tainted"))
    assert tainted & TAINT_UNSIGNED_MODULE
    assert tainted & TAINT_OOT_MODULE


def test_loading_the_same_module_twice_is_eexist(vm: Vm, signed_modules: dict[str, Path]) -> None:
    """A second finit_module of an already live module fails with EEXIST."""
    if not vm.eval("os.path.isdir('/sys/module/ms_params')"):
        assert load(vm, signed_modules["ms_params"]) == 0
    assert load(vm, signed_modules["ms_params"]) == errno.EEXIST


def test_failing_init_returns_its_errno(vm: Vm, signed_modules: dict[str, Path]) -> None:
    """A module whose init returns -ENODEV makes finit_module fail with ENODEV, and is gone."""
    assert load(vm, signed_modules["ms_enodev"]) == errno.ENODEV
    assert not vm.eval("os.path.exists('/sys/module/ms_enodev')")


def test_dependent_module_needs_its_dependency_first(
    vm: Vm, signed_modules: dict[str, Path]
) -> None:
    """ms_consumer fails with ENOENT (unresolved symbol) until ms_exporter is loaded.

    finit_module does no dependency handling: load order is the caller's job.
    """
    assert load(vm, signed_modules["ms_consumer"]) == errno.ENOENT
    assert load(vm, signed_modules["ms_exporter"]) == 0
    assert load(vm, signed_modules["ms_consumer"]) == 0
    assert vm.eval("os.listdir('/sys/module/ms_exporter/holders')") == ["ms_consumer"]
    assert int(vm.eval("delete_module('ms_exporter')")) == errno.EWOULDBLOCK


def test_a_clean_module_shows_no_taint_of_its_own_on_a_tainted_node(
    vm: Vm, signed_modules: dict[str, Path], kernel: Kernel
) -> None:
    """Control for the per-module check: on the shared node, whose kernel-wide ``tainted``
    has E and O (a test module is live), Debian's own signed in-tree ``crc8`` shows no
    flags in ``/sys/module/crc8/taint``: the check tells one load from another. On 6.12 it
    is Debian 13's ``crc8.ko.xz`` (ECDSA P-384-signed), handed to the kernel compressed with
    MODULE_INIT_COMPRESSED_FILE; on 7.2 sid's, which lives in ``lib/crc/``."""
    if not vm.eval("os.path.isdir('/sys/module/ms_params')"):
        assert load(vm, signed_modules["ms_params"]) == 0
    tainted = int(vm.read("/proc/sys/kernel/tainted"))
    assert tainted & TAINT_UNSIGNED_MODULE and tainted & TAINT_OOT_MODULE
    crc8 = f"/lib/modules/{kernel.release}/{kernel.in_tree('crc8')}"
    if not vm.eval("os.path.isdir('/sys/module/crc8')"):
        if crc8.endswith(".xz"):  # decompressed by the kernel (MODULE_DECOMPRESS)
            loaded = vm.eval(f"finit_module({crc8!r}, '', {MODULE_INIT_COMPRESSED_FILE})")
        else:
            loaded = vm.eval(f"finit_module({crc8!r})")
        assert int(loaded) == 0
    assert vm.read("/sys/module/crc8/taint") == ""


def test_the_built_in_sys_module_names_read_from_the_image_are_the_kernels(
    vm: Vm, kernel: Kernel
) -> None:
    """The /sys/module names modstage reads from the image for built-in code (the `__param`
    prefixes of parameters with a mode, `kernel` for core_param, the `__modver` names) are
    all entries the booted kernel made without a module (no `initstate`); what the kernel
    has beyond them comes from built-in drivers registering under their module name, which
    the image's tables do not say (and modstage refuses such a `modules.builtin` name as
    policy)."""
    from service.verify.targetkernel.kimage import builtin_sysfs, vmlinux

    read = builtin_sysfs(vmlinux(kernel.image.read_bytes()))
    listed = vm.eval(
        "[(n, os.path.isdir(f'/sys/module/{n}/drivers')) for n in os.listdir('/sys/module') "
        "if os.path.isdir(f'/sys/module/{n}') "
        "and not os.path.exists(f'/sys/module/{n}/initstate')]"
    )
    booted = {name.replace("-", "_"): drivers for name, drivers in listed}
    assert read <= set(booted), sorted(read - set(booted))
    assert [name for name in set(booted) - read if not booted[name]] == []

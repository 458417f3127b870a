"""Kernel truth: how finit_module treats signed test modules without enforcement.

These run on the shared node (no `module.sig_enforce`), where a module signed with a key the
kernel does not know still loads but taints the kernel.
"""

from __future__ import annotations

import errno
from pathlib import Path

import pytest

from tests.vm.harness import Vm

pytestmark = pytest.mark.vm

TAINT_OOT_MODULE = 1 << 12  # O
TAINT_UNSIGNED_MODULE = 1 << 13  # E


def load(vm: Vm, module: Path, params: str = "") -> int:
    """Put `module` on the state share and finit_module it; 0 or the errno."""
    path = vm.put(module, f"kmod/{module.name}")
    return int(vm.eval(f"finit_module({path!r}, {params!r})"))


def test_signed_module_loads_with_parameters(vm: Vm, signed_modules: dict[str, Path]) -> None:
    """finit_module of a test-key-signed module succeeds and its parameters show in sysfs.

    The key is not in the kernel's keyring, so the load taints the kernel as unsigned (E) and
    out-of-tree (O) instead of failing.
    """
    assert load(vm, signed_modules["ms_params"], 'count=7 label="hello world"') == 0
    parameters = "/sys/module/ms_params/parameters"
    assert vm.read(f"{parameters}/count") == "7"
    assert vm.read(f"{parameters}/label") == "hello world"
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

"""Fixtures for the real-kernel tests: VMs, signed test modules, and the timing summary.

Every test here carries the `vm` marker. A VM that cannot start fails the run loudly; only
`MODSTAGE_VM_TESTS=skip` turns the VM tests into skips, and says so.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.vm.harness import Vm, VmFactory
from tests.vm.harness.timing import summary

SKIP_REASON = "VM tests skipped: MODSTAGE_VM_TESTS=skip"


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Skip VM tests only when explicitly asked to, never silently."""
    if os.environ.get("MODSTAGE_VM_TESTS") != "skip":
        return
    for item in items:
        if item.get_closest_marker("vm"):
            item.add_marker(pytest.mark.skip(reason=SKIP_REASON))


_vm_seconds: list[float] = []


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    """Add up the wall time spent in VM tests (setup, which boots, call and teardown)."""
    if "vm" in report.keywords:
        _vm_seconds.append(report.duration)


def pytest_terminal_summary(terminalreporter: Any) -> None:
    """Print boot times and the VM suite's time."""
    lines = summary()
    if os.environ.get("MODSTAGE_VM_TESTS") == "skip":
        terminalreporter.section("modstage VM")
        terminalreporter.write_line(f"NOT RUN: {SKIP_REASON}", yellow=True, bold=True)
        return
    if not lines and not _vm_seconds:
        return
    terminalreporter.section("modstage VM")
    for line in lines:
        terminalreporter.write_line(line)
    terminalreporter.write_line(f"VM suite time: {sum(_vm_seconds):.1f} s")


@pytest.fixture(scope="session")
def boot_vm(tmp_path_factory: pytest.TempPathFactory) -> Iterator[VmFactory]:
    """`boot_vm(name, **options)` boots a Vm with a fresh state share; all closed at the end."""
    started: list[Vm] = []

    def boot(name: str, **options: Any) -> Vm:
        state = tmp_path_factory.mktemp(f"{name}-state")
        vm = Vm(state, name=name, **options)
        started.append(vm)
        vm.start()
        return vm

    yield boot
    for vm in reversed(started):
        vm.close()


@pytest.fixture(scope="session")
def vm(boot_vm: VmFactory) -> Vm:
    """The shared node: default kernel arguments, 1 GiB with room to hot-plug 3 GiB more.

    Tests on it must not interfere: each uses its own modules and leaves global knobs as found.
    """
    return boot_vm("node")


@pytest.fixture(scope="session")
def test_modules() -> dict[str, Path]:
    """The unsigned test modules (tests/kmod), built once and cached on disk."""
    from tests.kmod import build_modules

    return build_modules()


@pytest.fixture(scope="session")
def signed_modules(
    test_modules: dict[str, Path], tmp_path_factory: pytest.TempPathFactory
) -> dict[str, Path]:
    """Every test module signed with a key made for this run (unknown to the kernel)."""
    from tests.kmod import make_key, sign

    directory = tmp_path_factory.mktemp("signed")
    key = make_key(directory / "key")
    return {name: sign(ko, key, directory / ko.name) for name, ko in test_modules.items()}

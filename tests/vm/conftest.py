"""Fixtures for the real-kernel tests: VMs, signed test modules, and the timing summary.

`kernel` is parametrised over `MODSTAGE_KERNELS` (default `6.1,6.12,7.2`: Debian 12's kernel on
the host's root, Debian 13's and sid's each in its suite's root), and the `boot_vm`, `vm`,
`test_modules` and `signed_modules` fixtures follow it, so a test that uses any of them runs
once per kernel it is written for (ids `[6.1]`, `[6.12]`, `[7.2]`) and every node of that run
boots that kernel. Every test here carries
the `vm` marker. A VM that cannot start fails the run loudly; only
`MODSTAGE_VM_TESTS=skip` turns the VM tests into skips, and says so.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.vm.harness import Vm, VmFactory, kmod
from tests.vm.harness.kernel import Kernel, kernel_series
from tests.vm.harness.timing import summary

SKIP_REASON = "VM tests skipped: MODSTAGE_VM_TESTS=skip"


NOT_WRITTEN = "not yet written for"


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Skip VM tests only when explicitly asked to, never silently. With
    `MODSTAGE_VM_WRITTEN_ONLY=1` (tests/run's streams, each picking its kernels) a test
    written for none of the picked kernels is deselected, and counted as such, instead of
    showing as a skip."""
    if os.environ.get("MODSTAGE_VM_WRITTEN_ONLY") == "1":
        unwritten = [
            item for item in items
            if any(str(m.kwargs.get("reason", "")).startswith(NOT_WRITTEN)
                   for m in item.iter_markers("skip"))
        ]  # fmt: skip
        if unwritten:
            config.hook.pytest_deselected(items=unwritten)
            items[:] = [item for item in items if item not in unwritten]
    if os.environ.get("MODSTAGE_VM_TESTS") != "skip":
        return
    for item in items:
        if item.get_closest_marker("vm"):
            item.add_marker(pytest.mark.skip(reason=SKIP_REASON))


_vm_seconds: dict[str, float] = {}
_SERIES_ID = re.compile(r"[\[-](6\.1|6\.12|7\.2)[\]-]")


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    """Add up the wall time spent in VM tests (setup, which boots, call and teardown), per
    kernel (a test without a kernel parameter counts as "other")."""
    if "vm" in report.keywords:
        match = _SERIES_ID.search(report.nodeid)
        series = match[1] if match else "other"
        _vm_seconds[series] = _vm_seconds.get(series, 0.0) + report.duration


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
    per_kernel = ", ".join(f"{k}: {v:.1f} s" for k, v in sorted(_vm_seconds.items()))
    terminalreporter.write_line(f"VM suite time: {sum(_vm_seconds.values()):.1f} s ({per_kernel})")


PROVEN_ON = ("6.1",)  # where a test without a `kernels` marker is known to hold


def pytest_configure(config: pytest.Config) -> None:
    """Register the `kernels` marker."""
    config.addinivalue_line(
        "markers",
        "kernels(*series): the kernel series a VM test is written for (default: 6.1 only); "
        "it runs on those of them that MODSTAGE_KERNELS picks",
    )


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    """Run every test that boots a node once per kernel of `MODSTAGE_KERNELS` that it is
    written for. A kernel it is not written for is not generated at all (tests/vm/README.md
    lists which tests run where); only a run whose kernels it knows none of shows it as a
    skip that says so."""
    if "kernel_series" not in metafunc.fixturenames:
        return
    marker = metafunc.definition.get_closest_marker("kernels")
    written_for = marker.args if marker else PROVEN_ON
    picked = kernel_series()
    params = [pytest.param(series, id=series) for series in picked if series in written_for]
    if not params:
        why = f"{NOT_WRITTEN} {', '.join(picked)} (runs on {', '.join(written_for)})"
        params = [pytest.param(s, id=s, marks=pytest.mark.skip(reason=why)) for s in picked]
    metafunc.parametrize("kernel_series", params, scope="session")


@pytest.fixture(scope="session")
def kernel(kernel_series: str) -> Kernel:
    """The guest kernel of this parametrisation: Debian 12's 6.1, Debian 13's 6.12 or sid's 7.2."""
    return Kernel.named(kernel_series)


@pytest.fixture(scope="session")
def boot_vm(tmp_path_factory: pytest.TempPathFactory, kernel: Kernel) -> Iterator[VmFactory]:
    """`boot_vm(name, **options)` boots a Vm of `kernel` with a fresh state share; all closed
    when the kernel's tests are done."""
    started: list[Vm] = []

    def boot(name: str, **options: Any) -> Vm:
        name = f"{name}-{kernel.series}"
        state = tmp_path_factory.mktemp(f"{name}-state")
        vm = Vm(state, name=name, **{"kernel": kernel, **options})
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
def test_modules(kernel: Kernel) -> dict[str, Path]:
    """The unsigned test modules (tests/kmod) built against `kernel`'s headers, cached on disk."""
    return kmod.build_modules(kernel)


@pytest.fixture(scope="session")
def signed_modules(
    kernel: Kernel, test_modules: dict[str, Path], tmp_path_factory: pytest.TempPathFactory
) -> dict[str, Path]:
    """Every test module signed by `kernel`'s own sign-file with a key made for this run
    (unknown to the kernel)."""
    from tests.kmod import make_key

    directory = tmp_path_factory.mktemp(f"signed-{kernel.series}")
    key = make_key(directory / "key")
    return {
        name: kmod.sign(kernel, ko, key, directory / ko.name) for name, ko in test_modules.items()
    }

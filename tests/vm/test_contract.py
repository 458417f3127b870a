"""The contract against Debian's kernels (12's 6.1, 13's 6.12): the same cases as the fakes, in
ONE boot per kernel.

``tests/contract/cases.py`` holds the assertions; here they drive ``LinuxKernel`` and the
guest's ``/sys`` (a :class:`~tests.contract.subject.KernelSubject` inside the guest agent)
on a node of its own, with one hot-added DIMM so an offline memory block exists (Debian 13
onlines hot-added memory itself, `auto_online_blocks` = `online`: the node sets `offline`
first, as modstage does before its first hot-add). A VM that
cannot start fails every case (the ``boot_vm`` fixture raises).
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest

from tests.contract.cases import CASES, Bench, Case, ModuleFile, contract_files
from tests.vm.harness import Vm, VmFactory

pytestmark = [pytest.mark.vm, pytest.mark.kernels("6.1", "6.12")]

MEMORY = "/sys/devices/system/memory"
SETUP = (
    "from pathlib import Path\n"
    "from service.host.modules import LinuxKernel\n"
    "from service.host.sysfs import Sysfs\n"
    "from tests.contract.subject import KernelSubject\n"
    "_contract = KernelSubject(LinuxKernel(Path('/sys')), Sysfs(Path('/sys')))\n"
)


class VmSubject:
    """The guest's KernelSubject, called through the agent (every answer is JSON)."""

    def __init__(self, vm: Vm) -> None:
        self.vm = vm

    def _call(self, method: str, *args: Any) -> Any:
        return self.vm.eval(f"_contract.{method}(*{list(args)!r})", timeout=120)

    def load(self, path: str, params: str = "") -> int:
        """finit_module in the guest."""
        return int(self._call("load", path, params))

    def load_image(self, path: str, name: str, params: str = "") -> int:
        """finit_module from a sealed memfd in the guest."""
        return int(self._call("load_image", path, name, params))

    def unload(self, name: str) -> int:
        """delete_module in the guest."""
        return int(self._call("unload", name))

    def loaded(self) -> dict[str, str | None]:
        """The guest's live modules."""
        return dict(self._call("loaded"))

    def modprobe(self, names: list[str]) -> int:
        """modprobe -a in the guest."""
        return int(self._call("modprobe", names))

    def blocks(self) -> dict[int, str]:
        """The guest's memory blocks (JSON keys come back as strings)."""
        return {int(n): str(s) for n, s in self._call("blocks").items()}

    def write(self, attribute: str, value: str) -> int:
        """Write a guest sysfs attribute."""
        return int(self._call("write", attribute, value))

    def read(self, attribute: str) -> str:
        """Read a guest sysfs attribute."""
        return str(self._call("read", attribute))

    def entries(self, directory: str) -> list[str]:
        """List a guest sysfs directory."""
        return [str(n) for n in self._call("entries", directory)]

    def point_firmware(self, view: str, wanted: bool) -> int:
        """FirmwareView.point in the guest."""
        return int(self._call("point_firmware", view, wanted))


@pytest.fixture(scope="module")
def contract_vm(boot_vm: VmFactory) -> Vm:
    """A node of its own with one hot-added (offline) DIMM and the guest's subject."""
    vm = boot_vm("contract")
    vm.run(f"echo offline > {MEMORY}/auto_online_blocks").check()
    count = len(vm.eval(f"os.listdir({MEMORY!r})"))
    vm.hotplug_memory("256M")
    deadline = time.monotonic() + 60
    while len(vm.eval(f"os.listdir({MEMORY!r})")) < count + 2:
        assert time.monotonic() < deadline, "the hot-added DIMM's memory blocks never appeared"
        time.sleep(0.5)
    vm.python(SETUP)
    return vm


@pytest.fixture(scope="module")
def bench(contract_vm: Vm, test_modules: dict[str, Path]) -> Bench:
    """The test modules on the state share, with their guest paths."""
    files = contract_files(test_modules, contract_vm.state_dir / "contract")
    modules = {n: ModuleFile(p, contract_vm.guest_path(p)) for n, p in files.items()}
    return Bench(modules, "/run/modstage-contract/firmware")


@pytest.mark.parametrize("case", CASES, ids=[c.__name__ for c in CASES])
def test_kernel_keeps_the_contract(case: Case, contract_vm: Vm, bench: Bench) -> None:
    """Each contract case holds for Debian's 6.1 and 6.12 kernels, as it does for the fakes."""
    case(VmSubject(contract_vm), bench)

"""The contract against the fakes (``tests.service.fakes``): fast, on every unit run.

``tests/vm/test_contract.py`` runs the same cases against Debian's 6.1 kernel.
"""

from __future__ import annotations

import errno
from pathlib import Path

import pytest

from service.host.modules import live_modules
from service.verify.modfile.modinfo import ModInfo
from tests.contract.cases import CASES, INTREE, Bench, Case, ModuleFile
from tests.contract.conftest import contract_sys
from tests.contract.subject import KernelSubject
from tests.kmod import kernel_release
from tests.service.fakes import FakeKernel, FakeSysfs


def fake_subject(sys: Path) -> KernelSubject:
    """A fresh fake kernel, as the VM's: ms_enodev's init fails, ts_kmp is in-tree (the
    installed kernel's own file)."""
    intree_file = Path("/lib/modules") / kernel_release() / "kernel/lib" / f"{INTREE}.ko"
    intree = {INTREE: ModInfo.from_bytes(intree_file.read_bytes()).srcversion}
    kernel = FakeKernel(fail={"ms_enodev": errno.ENODEV}, intree=intree, sys=contract_sys(sys))
    return KernelSubject(kernel, FakeSysfs(sys))


@pytest.mark.parametrize("case", CASES, ids=[c.__name__ for c in CASES])
def test_fakes_keep_the_kernel_contract(case: Case, files: dict[str, Path], tmp_path: Path) -> None:
    """Each contract case holds for FakeKernel and FakeSysfs, as it does for the kernel; and
    the fake's sysfs tree says what its ``loaded()`` says, read as ``LinuxKernel`` reads it."""
    modules = {n: ModuleFile(p, str(p)) for n, p in files.items()}
    subject = fake_subject(tmp_path / "sys")
    case(subject, Bench(modules, str(tmp_path / "run/firmware")))
    assert live_modules(subject.sysfs) == subject.kernel.loaded()

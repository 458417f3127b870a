"""The contract against :class:`~service.host.recording.RecordingKernel`, the kernel of
``modstage boot --dry-run`` and of a sandbox root.

A dry run predicts the boot only as far as its kernel answers as the real one does: every
module case runs here as against the fakes and Debian's kernel, with the dry run's own
sysfs (:class:`~service.host.sysfs.RecordingSysfs`) and the target's real module lists.
A case a recording kernel cannot keep is named in :data:`EXCLUDED` with the reason, and is
expected to fail (strictly: an exclusion that starts passing fails the run, so it goes).
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from service.host.recording import RecordingKernel
from service.host.sysfs import RecordingSysfs
from service.verify.modfile.modinfo import ModInfo
from tests.contract import cases
from tests.contract.cases import CASES, Bench, Case, ModuleFile
from tests.contract.conftest import contract_sys
from tests.contract.subject import KernelSubject
from tests.kmod import kernel_release

NO_SYSFS = (
    "the dry run writes nothing: the recording kernel keeps what it loaded in memory, never "
    "under sys/module (on / that is the machine's /sys), and RecordingSysfs records writes "
    "without the kernel's answers (FakeSysfs and Debian's kernel keep this case)"
)
#: Contract cases a recording kernel cannot keep, and why.
EXCLUDED: dict[Case, str] = {
    cases.a_failing_init_leaves_nothing_live: (
        "a recording kernel runs no module init: an init that fails (ms_enodev's -ENODEV) is "
        "known only by loading the module, so the dry run cannot predict it"
    ),
    **dict.fromkeys(cases.SYSFS_CASES, NO_SYSFS),
}


def module_tree(into: Path) -> Path:
    """The running kernel's ``modules.dep`` and ``modules.builtin``, as modprobe reads them."""
    real = Path("/lib/modules") / kernel_release()
    into.mkdir(parents=True)
    for listing in ("modules.dep", "modules.builtin"):
        shutil.copyfile(real / listing, into / listing)
    return into


def snapshot(root: Path) -> dict[str, str]:
    """Every path under ``root`` with its contents (a directory's is empty)."""
    return {str(p.relative_to(root)): "" if p.is_dir() else p.read_text() for p in root.rglob("*")}


@pytest.mark.parametrize(
    "case",
    [
        pytest.param(c, marks=pytest.mark.xfail(strict=True, reason=EXCLUDED[c]))
        if c in EXCLUDED
        else c
        for c in CASES
    ],
    ids=[c.__name__ for c in CASES],
)
def test_recording_kernel_keeps_the_kernel_contract(
    case: Case, files: dict[str, Path], tmp_path: Path
) -> None:
    """Each module case holds for the dry run's kernel and sysfs as for the real kernel, and
    the sandbox's sysfs tree is left exactly as it was."""
    sys = contract_sys(tmp_path / "sys")
    before = snapshot(sys)
    kernel = RecordingKernel(
        sys, identify=ModInfo.from_elf, modules=module_tree(tmp_path / "lib/modules")
    )
    subject = KernelSubject(kernel, RecordingSysfs(sys, kernel.calls))
    modules = {n: ModuleFile(p, str(p)) for n, p in files.items()}
    case(subject, Bench(modules, str(tmp_path / "run/firmware")))
    assert snapshot(sys) == before


def test_every_exclusion_names_a_contract_case_and_a_reason() -> None:
    """An exclusion is of a case the contract holds, with its reason in words."""
    assert set(EXCLUDED) <= set(CASES)
    assert all(len(why.split()) > 5 for why in EXCLUDED.values())
    assert set(CASES) - set(EXCLUDED), "the recording kernel must keep some of the contract"


#: The cases a sandbox's kernel keeps: the module calls and what sysfs shows of the modules
#: (a sandbox's memory and firmware files are plain files, which take any write as it is).
SANDBOX_CASES = (
    *cases.MODULE_CASES,
    cases.sysfs_shows_a_live_module_and_its_srcversion,
    cases.sysfs_shows_who_uses_a_module,
)


@pytest.mark.parametrize(
    "case",
    [
        pytest.param(c, marks=pytest.mark.xfail(strict=True, reason=EXCLUDED[c]))
        if c is cases.a_failing_init_leaves_nothing_live
        else c
        for c in SANDBOX_CASES
    ],
    ids=[c.__name__ for c in SANDBOX_CASES],
)
def test_a_sandbox_kernel_keeps_the_kernel_contract(
    case: Case, files: dict[str, Path], tmp_path: Path
) -> None:
    """The sandbox's kernel (``shows``: what it loads appears under ``sys/module``) keeps
    each module case, and those of what sysfs shows of the modules, over the sandbox's own
    sysfs tree (the dry run's kernel cannot: it writes nothing)."""
    from service.host.sysfs import Sysfs

    sys = contract_sys(tmp_path / "sys")
    kernel = RecordingKernel(
        sys, identify=ModInfo.from_elf, modules=module_tree(tmp_path / "lib/modules"), shows=True
    )
    subject = KernelSubject(kernel, Sysfs(sys))
    modules = {n: ModuleFile(p, str(p)) for n, p in files.items()}
    case(subject, Bench(modules, str(tmp_path / "run/firmware")))

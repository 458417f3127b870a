"""The sandbox's recording kernel names what it loads as the kernel does: by the ELF."""

from __future__ import annotations

import errno
import os
import shutil
from pathlib import Path

import pytest

from service.errors import LoadError
from service.kernel.recording import RecordingKernel
from service.verify.modinfo import ModInfo


def test_a_renamed_module_is_recorded_under_its_elf_name(
    modules: dict[str, Path], tmp_path: Path
) -> None:
    """A copy of ms_params called ms_renamed.ko, by descriptor or memfd, is live as ms_params
    with its srcversion; the file's name is unknown to unload."""
    renamed = Path(shutil.copyfile(modules["ms_params"], tmp_path / "ms_renamed.ko"))
    srcversion = ModInfo.from_bytes(renamed.read_bytes()).srcversion
    kernel = RecordingKernel(tmp_path / "sys", identify=ModInfo.from_elf)
    fd = os.open(renamed, os.O_RDONLY)
    try:
        kernel.load(fd, "count=1")
    finally:
        os.close(fd)
    assert kernel.loaded() == {"ms_params": srcversion}
    with pytest.raises(LoadError) as refused:
        kernel.unload("ms_renamed")
    assert refused.value.errno == errno.ENOENT
    kernel.unload("ms_params")
    kernel.load_image(renamed.read_bytes(), "whatever.ko", "")
    assert kernel.loaded() == {"ms_params": srcversion}
    calls = [c[0] for c in kernel.calls]
    assert calls == ["finit_module", "delete_module", "delete_module", "finit_module"]


def test_an_unreadable_elf_is_enoexec(tmp_path: Path) -> None:
    """Bytes that are no module are refused with ENOEXEC, as finit_module refuses them."""
    kernel = RecordingKernel(tmp_path / "sys", identify=ModInfo.from_elf)
    with pytest.raises(LoadError) as refused:
        kernel.load_image(b"\x7fELF" + b"\0" * 60, "junk.ko", "")
    assert refused.value.errno == errno.ENOEXEC
    assert kernel.loaded() == {}

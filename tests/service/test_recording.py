"""The sandbox's recording kernel names what it loads as the kernel does: by the ELF."""

from __future__ import annotations

import errno
import os
import shutil
from pathlib import Path

import pytest

from service.errors import LoadError
from service.host.recording import RecordingKernel
from service.verify.modfile.modinfo import ModInfo


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


def test_modprobe_loads_what_the_module_tree_lists_with_its_dependencies(tmp_path: Path) -> None:
    """A name in ``modules.dep`` is live afterwards with every module it needs; a built-in
    name succeeds and loads nothing; an unknown name is ENOENT after the rest are loaded."""
    tree = tmp_path / "lib/modules/r"
    tree.mkdir(parents=True)
    (tree / "modules.dep").write_text(
        "kernel/lib/crc8.ko:\n"
        "kernel/drivers/net/qed.ko.xz: kernel/lib/crc8.ko kernel/lib/lib-x.ko\n"
        "kernel/lib/lib-x.ko:\n"
    )
    (tree / "modules.builtin").write_text("kernel/drivers/ext4.ko\n")
    kernel = RecordingKernel(tmp_path / "sys", identify=ModInfo.from_elf, modules=tree)
    kernel.modprobe(["qed", "ext4"])
    assert kernel.loaded() == {"qed": None, "crc8": None, "lib_x": None}
    with pytest.raises(LoadError) as refused:
        kernel.modprobe(["nosuch", "crc8"])
    assert refused.value.errno == errno.ENOENT and "nosuch" in str(refused.value)
    assert kernel.calls == [("modprobe", "qed", "ext4"), ("modprobe", "nosuch", "crc8")]


def test_a_module_tree_without_modules_dep_finds_nothing(tmp_path: Path) -> None:
    """Without depmod's list modprobe finds no module, so neither does the recording kernel."""
    kernel = RecordingKernel(tmp_path / "sys", modules=tmp_path / "lib/modules/r")
    with pytest.raises(LoadError) as refused:
        kernel.modprobe(["crc8"])
    assert refused.value.errno == errno.ENOENT and kernel.loaded() == {}


def test_a_module_the_sandbox_shows_in_use_cannot_be_unloaded(tmp_path: Path) -> None:
    """Modules live before the recording kernel keep their users: one with a holder or a
    reference in ``refcnt`` is EWOULDBLOCK; once its holder is unloaded, it unloads."""
    sys = tmp_path / "sys"
    for name, refcnt in {"used": 1, "user": 0, "pinned": 1}.items():
        (sys / f"module/{name}/holders").mkdir(parents=True)
        (sys / f"module/{name}/initstate").write_text("live\n")
        (sys / f"module/{name}/refcnt").write_text(f"{refcnt}\n")
    (sys / "module/used/holders/user").symlink_to(sys / "module/user")
    kernel = RecordingKernel(sys)
    for name in ("used", "pinned"):
        with pytest.raises(LoadError) as refused:
            kernel.unload(name)
        assert refused.value.errno == errno.EWOULDBLOCK
    kernel.unload("user")
    kernel.unload("used")
    assert kernel.loaded() == {"pinned": None}


def test_a_sandbox_kernel_shows_its_loads_under_sys_module(
    modules: dict[str, Path], tmp_path: Path
) -> None:
    """With ``shows`` (a sandbox's boot), a load is live under ``sys/module/<name>`` with the
    ELF's srcversion, as ``status`` reads it: a user is in its dependency's ``holders/`` and
    ``refcnt``, and an unload removes the module's directory and its holder link."""
    from service.status.live import LiveModule, live_module

    sys = tmp_path / "sys"
    kernel = RecordingKernel(sys, identify=ModInfo.from_elf, shows=True)
    for name in ("ms_exporter", "ms_consumer"):
        kernel.load_image(modules[name].read_bytes(), f"{name}.ko", "")
    exporter = live_module(sys, "ms_exporter")
    consumer = ModInfo.from_bytes(modules["ms_consumer"].read_bytes()).srcversion
    assert exporter is not None and exporter.refcnt == 1
    assert live_module(sys, "ms_consumer") == LiveModule("ms_consumer", consumer, None, 0)
    assert (sys / "module/ms_exporter/initstate").read_text() == "live\n"
    assert [p.name for p in (sys / "module/ms_exporter/holders").iterdir()] == ["ms_consumer"]
    assert kernel.loaded() == RecordingKernel(sys).loaded()  # a new kernel sees the same
    kernel.unload("ms_consumer")
    assert live_module(sys, "ms_consumer") is None
    assert list((sys / "module/ms_exporter/holders").iterdir()) == []
    assert (sys / "module/ms_exporter/refcnt").read_text() == "0\n"


def test_without_shows_nothing_is_written(modules: dict[str, Path], tmp_path: Path) -> None:
    """The dry run's kernel (``shows`` off) keeps its loads in memory: no ``sys`` is made."""
    kernel = RecordingKernel(tmp_path / "sys", identify=ModInfo.from_elf)
    kernel.load_image(modules["ms_params"].read_bytes(), "ms_params.ko", "")
    assert "ms_params" in kernel.loaded() and not (tmp_path / "sys").exists()

"""The contract: what the kernel does with modstage's calls, asserted once for fakes and VM.

Each case takes a :class:`~tests.contract.subject.Subject` and the :class:`Bench` (the test
modules as the subject sees them) and leaves the kernel as it found it, so the VM runs
every case in one boot. ``tests/contract/test_fakes.py`` runs them against
``tests.service.fakes``; ``tests/vm/test_contract.py`` against Debian's 6.1 in the guest;
``tests/contract/test_recording.py`` runs the module cases against the dry run's and the
sandbox's :class:`~service.host.recording.RecordingKernel`, each exclusion named.
"""

from __future__ import annotations

import errno
import shutil
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from service.verify.modfile.modinfo import ModInfo
from tests.contract.subject import (
    AUTO_ONLINE,
    FIRMWARE_PATH,
    Subject,
    state_of,
    zones_of,
)

INTREE = "ts_kmp"  # an in-tree module with no dependencies and no hardware (lib/ts_kmp.ko)
MISSING = "ms_no_such_module"
RENAMED = "ms_renamed"  # the file name of a copy of ms_params


@dataclass(frozen=True)
class ModuleFile:
    """A test module: where the assertions read it, and its path as the subject sees it."""

    local: Path
    path: str

    def srcversion(self) -> str | None:
        """What ``.modinfo`` says, read on the machine running the assertions."""
        return ModInfo.from_bytes(self.local.read_bytes()).srcversion


@dataclass(frozen=True)
class Bench:
    """The modules the cases load and a firmware view directory, as the subject sees them."""

    modules: dict[str, ModuleFile]
    firmware_view: str


def contract_files(built: dict[str, Path], into: Path) -> dict[str, Path]:
    """The built test modules plus ``ms_renamed.ko``, a copy of ms_params under another name."""
    into.mkdir(parents=True, exist_ok=True)
    files = {
        n: Path(shutil.copyfile(p, into / p.name)) for n, p in built.items() if n != "ms_panic"
    }
    files[RENAMED] = Path(shutil.copyfile(built["ms_params"], into / f"{RENAMED}.ko"))
    return files


def module_is_named_by_its_elf_not_its_file(k: Subject, bench: Bench) -> None:
    """A renamed copy loads under the module's own name; the file's name is unknown to unload."""
    m = bench.modules
    assert k.load(m[RENAMED].path, "count=3") == 0
    live = k.loaded()
    assert "ms_params" in live and RENAMED not in live
    assert k.unload(RENAMED) == errno.ENOENT
    assert k.unload("ms_params") == 0
    assert "ms_params" not in k.loaded()


def second_load_of_a_live_module_is_eexist(k: Subject, bench: Bench) -> None:
    """Loading a live module again, from any file or a memfd of any name, is EEXIST."""
    m = bench.modules
    assert k.load(m["ms_params"].path) == 0
    assert k.load(m["ms_params"].path) == errno.EEXIST
    assert k.load(m[RENAMED].path) == errno.EEXIST
    assert k.load_image(m["ms_params"].path, "other.ko") == errno.EEXIST
    assert k.unload("ms_params") == 0
    assert k.load_image(m["ms_params"].path, "other.ko") == 0
    assert "ms_params" in k.loaded() and "other" not in k.loaded()
    assert k.unload("ms_params") == 0


def loaded_shows_srcversion_only_where_modinfo_has_one(k: Subject, bench: Bench) -> None:
    """srcversion is .modinfo's (MODULE_VERSION modules); a module without one shows None."""
    m = bench.modules
    expected = m["ms_params"].srcversion()
    assert expected and m["ms_exporter"].srcversion() is None
    assert k.load(m["ms_params"].path) == 0
    assert k.load(m["ms_exporter"].path) == 0
    live = k.loaded()
    assert (live["ms_params"], live["ms_exporter"]) == (expected, None)
    assert k.unload("ms_params") == 0 and k.unload("ms_exporter") == 0


def sysfs_shows_a_live_module_and_its_srcversion(k: Subject, bench: Bench) -> None:
    """``/sys/module/X`` says ``initstate`` live, and ``srcversion`` only where .modinfo has one."""
    m = bench.modules
    expected = m["ms_params"].srcversion()
    assert k.load(m["ms_params"].path) == 0
    assert k.load(m["ms_exporter"].path) == 0
    assert k.read("module/ms_params/srcversion") == expected
    assert "srcversion" not in k.entries("module/ms_exporter")
    assert k.read("module/ms_params/initstate") == "live"
    assert k.unload("ms_params") == 0 and k.unload("ms_exporter") == 0


def a_module_in_use_cannot_be_unloaded(k: Subject, bench: Bench) -> None:
    """Without its dependency a module is ENOENT; a used module is EWOULDBLOCK until freed."""
    m = bench.modules
    assert k.load(m["ms_consumer"].path) == errno.ENOENT
    assert "ms_consumer" not in k.loaded()
    assert k.load(m["ms_exporter"].path) == 0
    assert k.load(m["ms_consumer"].path) == 0
    assert k.unload("ms_exporter") == errno.EWOULDBLOCK
    assert "ms_exporter" in k.loaded()
    assert k.unload("ms_consumer") == 0
    assert k.unload("ms_exporter") == 0
    assert k.unload("ms_exporter") == errno.ENOENT


def sysfs_shows_who_uses_a_module(k: Subject, bench: Bench) -> None:
    """The user of a module is under its ``holders/`` and holds one reference in ``refcnt``;
    a module that never loaded has no ``/sys/module`` directory."""
    m = bench.modules
    assert k.load(m["ms_consumer"].path) == errno.ENOENT
    assert k.entries("module/ms_consumer") == []
    assert k.load(m["ms_exporter"].path) == 0
    assert k.load(m["ms_consumer"].path) == 0
    assert k.entries("module/ms_exporter/holders") == ["ms_consumer"]
    assert k.read("module/ms_exporter/refcnt") == "1"
    assert k.read("module/ms_consumer/refcnt") == "0"
    assert k.unload("ms_consumer") == 0
    assert k.entries("module/ms_consumer") == []
    assert k.entries("module/ms_exporter/holders") == []
    assert k.read("module/ms_exporter/refcnt") == "0"
    assert k.unload("ms_exporter") == 0


def a_failing_init_leaves_nothing_live(k: Subject, bench: Bench) -> None:
    """A module whose init returns -ENODEV is ENODEV and not live afterwards."""
    assert k.load(bench.modules["ms_enodev"].path) == errno.ENODEV
    assert "ms_enodev" not in k.loaded()
    assert k.unload("ms_enodev") == errno.ENOENT


def modprobe_loads_in_tree_modules_and_fails_on_unknown_names(k: Subject, bench: Bench) -> None:
    """modprobe loads an in-tree module (again: no error); an unknown name is ENOENT."""
    assert INTREE not in k.loaded()
    assert k.modprobe([]) == 0
    assert k.modprobe([INTREE]) == 0
    assert INTREE in k.loaded()
    assert k.modprobe([INTREE]) == 0
    assert k.modprobe([MISSING]) == errno.ENOENT
    assert MISSING not in k.loaded()
    assert k.unload(INTREE) == 0
    assert k.modprobe([MISSING, INTREE]) == errno.ENOENT  # the known one is still loaded
    assert INTREE in k.loaded()
    assert k.unload(INTREE) == 0


def an_onlined_block_reads_back_online(k: Subject, bench: Bench) -> None:
    """online_movable reads back "online" with zone Movable; onlining twice or garbage is
    EINVAL; offlining reads back "offline"."""
    offline = sorted(n for n, s in k.blocks().items() if s == "offline")
    assert offline, "the bench needs an offline memory block"
    block = offline[-1]
    assert k.write(state_of(block), "online_movable") == 0
    assert k.blocks()[block] == "online" and k.read(state_of(block)) == "online"
    assert k.read(zones_of(block)) == "Movable"
    assert k.write(state_of(block), "online_movable") == errno.EINVAL
    assert k.write(state_of(block), "online_kernel") == errno.EINVAL
    assert k.write(state_of(block), "sideways") == errno.EINVAL
    assert k.write(state_of(block), "offline") == 0
    assert k.blocks()[block] == "offline"


def auto_online_blocks_reads_back_what_was_written(k: Subject, bench: Bench) -> None:
    """auto_online_blocks reads back the online type written; garbage is EINVAL."""
    before = k.read(AUTO_ONLINE)
    assert k.write(AUTO_ONLINE, "online_movable") == 0
    assert k.read(AUTO_ONLINE) == "online_movable"
    assert k.write(AUTO_ONLINE, "sideways") == errno.EINVAL
    assert k.read(AUTO_ONLINE) == "online_movable"
    assert k.write(AUTO_ONLINE, before) == 0


def firmware_path_reads_back_and_clears(k: Subject, bench: Bench) -> None:
    """firmware_class.path reads back what was written; a NUL clears it; 256 bytes is ENOSPC."""
    assert k.read(FIRMWARE_PATH) == ""
    assert k.write(FIRMWARE_PATH, "/run/elsewhere") == 0
    assert k.read(FIRMWARE_PATH) == "/run/elsewhere"
    assert k.point_firmware(bench.firmware_view, True) == 1  # someone else's: left alone
    assert k.write(FIRMWARE_PATH, "\0") == 0
    assert k.read(FIRMWARE_PATH) == ""
    assert k.write(FIRMWARE_PATH, "/" + "x" * 255) == errno.ENOSPC
    assert k.write(FIRMWARE_PATH, "/" + "x" * 254) == 0
    assert k.point_firmware(bench.firmware_view, False) == 0  # not ours: not cleared
    assert k.read(FIRMWARE_PATH) == "/" + "x" * 254
    assert k.write(FIRMWARE_PATH, "\0") == 0
    assert k.point_firmware(bench.firmware_view, True) == 0
    assert k.read(FIRMWARE_PATH) == bench.firmware_view
    assert k.point_firmware(bench.firmware_view, False) == 0
    assert k.read(FIRMWARE_PATH) == ""


Case = Callable[[Subject, Bench], None]
#: What the module calls answer (finit_module, delete_module, modprobe): the kernel's own.
MODULE_CASES: tuple[Case, ...] = (
    module_is_named_by_its_elf_not_its_file,
    second_load_of_a_live_module_is_eexist,
    loaded_shows_srcversion_only_where_modinfo_has_one,
    a_module_in_use_cannot_be_unloaded,
    a_failing_init_leaves_nothing_live,
    modprobe_loads_in_tree_modules_and_fails_on_unknown_names,
)
#: What sysfs shows of the modules and answers to modstage's writes.
SYSFS_CASES: tuple[Case, ...] = (
    sysfs_shows_a_live_module_and_its_srcversion,
    sysfs_shows_who_uses_a_module,
    an_onlined_block_reads_back_online,
    auto_online_blocks_reads_back_what_was_written,
    firmware_path_reads_back_and_clears,
)
CASES: tuple[Case, ...] = MODULE_CASES + SYSFS_CASES

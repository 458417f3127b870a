"""modstage's ELF readers on the real driver, against binutils and kmod.

The small test modules have a few dozen sections, a handful of ``__versions`` entries and
no relocation section of note. ``nvidia.ko`` links NVIDIA's binary object: tens of
megabytes, thousands of symbols, hundreds of imports, large ``.rela`` sections. Each test
reads a signed module with modstage's parsers and compares the result, entry by entry,
with what ``readelf``, ``nm``, ``objcopy`` and kmod (``modinfo``,
``modprobe --dump-modversions``) read from the same file.
"""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

import pytest

from service.verify.modfile.elf import Elf, parse_elf
from service.verify.modfile.modinfo import ModInfo
from tests.kmod import build_modules
from tests.nvidia import MODULE_NAMES, Driver

_SECTION = re.compile(
    r"^\s*\[\s*(\d+)\]\s+(\S*)\s+(\S+)\s+[0-9a-f]+\s+([0-9a-f]+)\s+([0-9a-f]+)\s+[0-9a-f]+\s+"
    r"([A-Za-z]*)\s+(\d+)\s+\d+\s+\d+$"
)
_RELOCS = re.compile(r"^Relocation section '([^']+)' at offset 0x[0-9a-f]+ contains (\d+) entr")


def run(*argv: str) -> str:
    return subprocess.run(argv, capture_output=True, text=True, check=True).stdout


def elf_of(path: Path) -> Elf:
    with path.open("rb") as f:
        fd = f.fileno()
        return parse_elf(lambda at, n: os.pread(fd, n, at), os.fstat(fd).st_size)


def info_of(path: Path) -> ModInfo:
    with path.open("rb") as f:
        fd = f.fileno()
        size = os.fstat(fd).st_size
        return ModInfo.from_elf(lambda at, n: os.pread(fd, n, at), size, symbols=True)


@pytest.fixture(scope="module", params=MODULE_NAMES)
def module(request: pytest.FixtureRequest, signed: dict[str, Path]) -> Path:
    """Each signed module of the real driver (the signature trails the ELF)."""
    return signed[request.param]


def test_section_headers_equal_readelf(module: Path) -> None:
    """Every section header modstage reads (name, offset, size, link) is readelf's."""
    listed = []
    for line in run("readelf", "-S", "-W", str(module)).splitlines():
        m = _SECTION.match(line)
        if m and m.group(3) != "NULL":
            listed.append((m.group(2), int(m.group(4), 16), int(m.group(5), 16), int(m.group(7))))
    ours = [
        ((s.name or b"").decode(), s.offset, s.size, s.link) for s in elf_of(module).sections[1:]
    ]
    assert ours == listed


def test_relocation_sections_hold_what_readelf_counts(module: Path) -> None:
    """Each ``.rela`` section as modstage reads its header holds readelf's count of 24-byte
    Elf64_Rela entries: the headers of the large relocation tables are read whole."""
    counts = {
        m.group(1): int(m.group(2))
        for line in run("readelf", "-r", "-W", str(module)).splitlines()
        if (m := _RELOCS.match(line))
    }
    sections = {(s.name or b"").decode(): s for s in elf_of(module).sections[1:]}
    assert counts and all(name.startswith(".rela") for name in counts)
    assert {name: sections[name].size // 24 for name in counts} == counts
    assert all(sections[name].size % 24 == 0 for name in counts)


def test_modinfo_is_the_raw_section_and_kmods_reading(module: Path, tmp_path: Path) -> None:
    """``.modinfo`` as modstage parses it is the section's NUL-separated strings (dumped by
    objcopy), its keys (alias, firmware, name, ...) read as kmod reads them, and its
    parameters kmod's (kmod joins ``parm`` and ``parmtype`` into one line per name)."""
    raw = tmp_path / "modinfo.bin"
    subprocess.run(
        ["objcopy", "--dump-section", f".modinfo={raw}", str(module), str(tmp_path / "x.ko")],
        check=True,
    )
    strings = [s.decode() for s in raw.read_bytes().split(b"\0") if s]
    info = info_of(module)
    assert [f"{k}={v}" for k, v in info.fields] == strings
    for key in ("alias", "firmware", "name", "vermagic", "license", "srcversion"):
        kmod = run("modinfo", "-F", key, str(module)).splitlines()
        assert [v for k, v in info.fields if k == key] == [v for v in kmod if v], key
    kmod_parms = [p.split(":", 1)[0] for p in run("modinfo", "-F", "parm", str(module)).split("\n")]
    ours = {v.split(":", 1)[0] for k, v in info.fields if k in ("parm", "parmtype")}
    assert ours == {p for p in kmod_parms if p}


def test_versions_equal_kmods_dump(module: Path) -> None:
    """``__versions`` as modstage reads it (symbol, CRC, in order) is kmod's
    ``modprobe --dump-modversions`` of the same file."""
    kmod = []
    for line in run("modprobe", "--dump-modversions", str(module)).splitlines():
        crc, name = line.split("\t")
        kmod.append((name, int(crc, 16)))
    assert list(info_of(module).versions) == kmod


def test_imports_and_exports_equal_nm_and_the_builds_module_symvers(
    module: Path, driver: Driver
) -> None:
    """The undefined symbols modstage reads are ``nm -u``'s (weak ones weak), and the
    exports it reads (CRC, GPL-only) are the driver build's ``Module.symvers`` lines for
    this module."""
    symbols = info_of(module).symbols
    assert symbols is not None and symbols.problem is None
    undefined = {}
    for line in run("nm", "--undefined-only", str(module)).splitlines():
        kind, name = line.split()
        undefined[name] = kind == "w"
    assert {i.name: i.weak for i in symbols.imports} == undefined
    listed = {}
    for line in driver.symvers.read_text().splitlines():
        crc, name, owner, kind, *_ = line.split("\t")
        if Path(owner).name == module.stem:
            listed[name] = (int(crc, 16), kind == "EXPORT_SYMBOL_GPL")
    assert {n: (e.crc, e.gpl) for n, e in symbols.exports.items()} == listed


def test_the_real_driver_goes_beyond_the_small_test_modules(signed: dict[str, Path]) -> None:
    """What the tests above exercise is more than the small modules ever did: nvidia.ko has
    more sections, ``__versions`` entries, relocation bytes and file bytes than any of them
    (so a parser limit tuned to the small modules would have shown above)."""
    small = list(build_modules().values())

    def facts(path: Path) -> tuple[int, int, int, int]:
        elf, info = elf_of(path), info_of(path)
        rela = sum(s.size for s in elf.sections if (s.name or b"").startswith(b".rela"))
        return len(elf.sections), len(info.versions), rela, path.stat().st_size

    real = facts(signed["nvidia"])
    for path in small:
        assert all(r > s for r, s in zip(real, facts(path), strict=True)), path.name

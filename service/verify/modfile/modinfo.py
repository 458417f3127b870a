"""A module's identity from its ELF, checked as Linux 6.1's loader checks it, and ``same_magic``.

The ELF itself is checked by :mod:`service.verify.modfile.elf` (``elf_validity_check``); this
module reads what ``setup_load_info`` then requires (an allocated ``.modinfo``, read as
``key=value`` strings, a symbol table, an allocated ``.gnu.linkonce.this_module`` whose
``struct module`` names the module) and ``__versions``, and applies the loader's version
checks (``check_version``, ``check_modinfo``'s vermagic rule). Anything it refuses raises
:class:`~service.errors.ModuleRejected`.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import TYPE_CHECKING

from service.errors import ModuleRejected
from service.verify.modfile.btf import btf_problem
from service.verify.modfile.elf import (
    MAX_TABLE,
    SHT_NOBITS,
    SHT_SYMTAB,
    Elf,
    ReadAt,
    Section,
    bounded,
    parse_elf,
    rejected,
)

if TYPE_CHECKING:
    from service.verify.modfile.symtab import Symbols

MODULE_NAME_AT, MODULE_NAME_LEN = 24, 56  # struct module: state, list, name[56] (64-bit)


@dataclass(frozen=True)
class ModInfo:
    """What ``.modinfo`` says about a module, plus the ELF facts the loader needs."""

    name: str | None
    vermagic: str | None
    depends: tuple[str, ...]
    srcversion: str | None
    firmware: tuple[str, ...]
    parm: tuple[str, ...]
    license: str | None
    has_versions: bool  # an allocated ``__versions`` section: modversions CRCs
    machine: int  # e_machine
    fields: tuple[tuple[str, str], ...]  # every key=value, in file order
    module_name: str | None = None  # the name the kernel registers (struct module's)
    write_exec: str | None = None  # the first W+X section, if any
    versions: tuple[tuple[str, int], ...] = ()  # __versions: (symbol, crc) as the kernel reads
    this_module_size: int | None = None  # .gnu.linkonce.this_module: sizeof(struct module)
    symbols: Symbols | None = None  # imports and exports, when asked for (not at boot)
    elf_strict: str | None = None  # what 6.12's ELF validation adds to 6.1's refuses here
    elf_6_4: str | None = None  # what 6.4's ELF validation adds to 6.1's refuses here
    exports_symbols: bool = False  # a non-empty __ksymtab: the module exports symbols
    kflagstab: bool = False  # an allocated __kflagstab (7.2's flags of its exports)
    btf: tuple[str, str] | None = None  # what btf_parse_module's first steps refuse in .BTF

    @cached_property
    def import_ns(self) -> frozenset[str]:
        """The namespaces ``MODULE_IMPORT_NS`` lists (``import_ns=`` in ``.modinfo``)."""
        return frozenset(v for k, v in self.fields if k == "import_ns")

    @cached_property
    def crc_of(self) -> dict[str, int]:
        """``__versions`` by symbol (the first entry of a name, as the kernel's walk finds)."""
        out: dict[str, int] = {}
        for name, crc in self.versions:
            out.setdefault(name, crc)
        return out

    @classmethod
    def from_bytes(cls, data: bytes, machine: int | None = None) -> ModInfo:
        """Parse an in-memory ELF (e.g. a decompressed module)."""
        return cls.from_elf(lambda at, n: data[at : at + n], len(data), machine)

    @classmethod
    def from_elf(
        cls, read_at: ReadAt, size: int, machine: int | None = None, *, symbols: bool = False
    ) -> ModInfo:
        """Check and parse the ELF object held in ``[0, size)`` of whatever ``read_at`` reads.

        ``symbols``: also read the symbol table (imports and exports; see
        :mod:`service.verify.modfile.symtab`).
        """
        elf = parse_elf(read_at, size, machine)
        read = bounded(read_at, size)
        info = elf.find_sec(b".modinfo")
        fields: list[tuple[str, str]] = []
        if info is not None and info.type != SHT_NOBITS:
            if info.size > MAX_TABLE:
                raise rejected(f".modinfo of {info.size} bytes")
            fields = _fields(read(info.offset, info.size))
        if not any(s.type == SHT_SYMTAB for s in elf.sections[1:]):
            raise rejected("module has no symbols (no SHT_SYMTAB section)")
        this = elf.find_sec(b".gnu.linkonce.this_module")
        if this is None:
            raise rejected("no module found in object (no allocated .gnu.linkonce.this_module)")
        raw_name = read_at(this.offset + MODULE_NAME_AT, MODULE_NAME_LEN)
        struct_name = raw_name.split(b"\0", 1)[0].decode("utf-8", "replace") or None
        wx = elf.write_exec()
        vers = elf.find_sec(b"__versions")
        ksymtab = elf.find_sec(b"__ksymtab")
        parsed = cls.from_fields(fields, elf.machine, vers is not None)
        if symbols:
            from service.verify.modfile.symtab import read_symbols  # not on the boot path
        return cls(
            **{
                **parsed.__dict__,
                "module_name": struct_name,
                "write_exec": None if wx is None else (wx.name or b"?").decode("utf-8", "replace"),
                "versions": () if vers is None else _versions(read, vers),
                "this_module_size": this.size,
                "elf_strict": elf.strict_problem,
                "elf_6_4": elf.problem_6_4,
                "exports_symbols": ksymtab is not None and ksymtab.size >= 12,
                "kflagstab": elf.find_sec(b"__kflagstab") is not None,
                "btf": _btf(elf, read),
                "symbols": read_symbols(elf, read) if symbols else None,
            }
        )

    @classmethod
    def from_fields(
        cls, fields: list[tuple[str, str]], machine: int, has_versions: bool
    ) -> ModInfo:
        """Build from parsed ``key=value`` pairs; the first of a single-valued key wins."""
        first: dict[str, str] = {}
        for key, value in fields:
            first.setdefault(key, value)

        def every(key: str) -> tuple[str, ...]:
            return tuple(v for k, v in fields if k == key)

        depends = tuple(d for d in first.get("depends", "").split(",") if d)
        return cls(
            first.get("name"),
            first.get("vermagic"),
            depends,
            first.get("srcversion"),
            every("firmware"),
            every("parm"),
            first.get("license"),
            has_versions,
            machine,
            tuple(fields),
        )


def _btf(elf: Elf, read: ReadAt) -> tuple[str, str] | None:
    """What the kernel's module BTF parser refuses in the first section named ``.BTF``
    (``find_any_sec``: allocated or not), or None (none, or one it does not refuse)."""
    sec = next((s for s in elf.sections[1:] if s.name == b".BTF"), None)
    if sec is None or sec.type == SHT_NOBITS:
        return None
    return btf_problem(lambda at, n: read(sec.offset + at, n), sec.size)


def _versions(read: ReadAt, sec: Section) -> tuple[tuple[str, int], ...]:
    """``struct modversion_info`` entries (unsigned long crc, char name[56])."""
    if sec.type == SHT_NOBITS or sec.size > MAX_TABLE:
        return ()
    data = read(sec.offset, sec.size - sec.size % 64)
    out = []
    for at in range(0, len(data), 64):
        crc = struct.unpack_from("<Q", data, at)[0]
        name = data[at + 8 : at + 64].split(b"\0", 1)[0].decode("utf-8", "replace")
        out.append((name, crc))
    return tuple(out)


def read_installed(path: Path) -> ModInfo | None:
    """The ``.modinfo`` and ELF facts of an installed module file (compressed too), or None."""
    from service.verify.compressed.decompress import compression, decompress

    try:
        with path.open("rb") as f:
            kind = compression(f.read(6))
            f.seek(0)
            data = f.read() if kind is None else decompress(f.read, kind)
        return ModInfo.from_bytes(data)
    except (OSError, ModuleRejected):
        return None


def read_vermagic(path: Path) -> str | None:
    """``vermagic=`` of an installed module file (compressed ones too), or None."""
    info = read_installed(path)
    return None if info is None else info.vermagic


def read_versions(path: Path) -> tuple[tuple[str, int], ...]:
    """``__versions`` of an installed module file: CRCs the target kernel exports."""
    info = read_installed(path)
    return () if info is None else info.versions


def _fields(section: bytes) -> list[tuple[str, str]]:
    """``key=value`` strings of a ``.modinfo`` section; the kernel's ``next_string`` walk."""
    out = []
    for raw in section.split(b"\0"):
        key, eq, value = raw.partition(b"=")
        if raw and eq:
            out.append((key.decode("utf-8", "replace"), value.decode("utf-8", "replace")))
    return out


def same_magic(amagic: str, bmagic: str, has_crcs: bool) -> bool:
    """The kernel's ``same_magic``: with modversions CRCs the release word is not compared."""
    if has_crcs:
        amagic = amagic[len(amagic.split(" ", 1)[0]) :]
        bmagic = bmagic[len(bmagic.split(" ", 1)[0]) :]
    return amagic == bmagic

"""A module's symbol table as the kernel links it: what it imports and what it exports.

``simplify_symbols`` walks ``.symtab`` from index 1: every ``SHN_UNDEF`` symbol is an
import the kernel resolves (a weak one may stay unresolved), a ``SHN_COMMON`` symbol or a
section index past ``e_shnum`` is refused (``ENOEXEC``). A module's exports are the
``__ksymtab_<name>`` labels kbuild places in ``__ksymtab`` (or ``__ksymtab_gpl``: GPL-only),
their CRCs the ``__crc_<name>`` labels in ``__kcrctab``/``__kcrctab_gpl`` (a ``u32`` at the
label's offset), their namespaces the strings at ``__kstrtabns_<name>`` in
``__ksymtab_strings``. The same layout holds on 6.1 and 6.12. Since 7.1 (55fcb926b6d8; Debian's
7.2) every export is in ``__ksymtab`` and a byte at the ``__flags_<name>`` label in
``__kflagstab`` says whether it is GPL-only (``KSYM_FLAG_GPL_ONLY``, bit 0;
``include/linux/module_symbol.h``). From 7.1 the loader ignores a module's ``__ksymtab_gpl``
(``find_module_sections`` only warns "ignoring obsolete section"): what is exported there
marks :attr:`Export.gpl_section`, and :func:`service.verify.linking.visible` drops it for
those targets.
"""

from __future__ import annotations

import struct
from collections.abc import Callable
from typing import NamedTuple

from service.errors import ModuleRejected
from service.verify.modfile.elf import MAX_TABLE, SHT_NOBITS, SHT_SYMTAB, Elf, Section

ReadAt = Callable[[int, int], bytes]

SHN_UNDEF, SHN_LIVEPATCH, SHN_ABS, SHN_COMMON = 0, 0xFF20, 0xFFF1, 0xFFF2
STB_WEAK = 2
_SYM = struct.Struct("<IBBHQQ")
MAX_SYMTAB = 64 << 20  # modstage policy: a symbol table read into memory at most this big
_EXPORT_SECTIONS = (b"__ksymtab", b"__ksymtab_gpl")
_CRC_SECTIONS = (b"__kcrctab", b"__kcrctab_gpl")
_FLAGS_SECTION = b"__kflagstab"
KSYM_FLAG_GPL_ONLY = 1


class Export(NamedTuple):
    """One exported symbol as the kernel's ``find_symbol`` sees it."""

    crc: int | None  # None: exported without a CRC (the kernel then skips check_version)
    gpl: bool  # EXPORT_SYMBOL_GPL: a module that is not GPL-compatible cannot use it
    namespace: str  # "" when the symbol is in no namespace
    owner: str  # "vmlinux", or the module (name, or the file it was read from)
    gpl_section: bool = False  # a module's export in __ksymtab_gpl (ignored from 7.1 on)


class Import(NamedTuple):
    """An undefined symbol of a module, at its place in ``.symtab``."""

    at: int  # its index in .symtab
    name: str
    weak: bool


class Symbols(NamedTuple):
    """A module's imports in ``.symtab`` order and its exports by name."""

    imports: tuple[Import, ...]
    exports: dict[str, Export]
    # the last ENOEXEC simplify_symbols finds on its own, with its place in .symtab
    problem: tuple[int, str] | None


def _fail(why: str) -> ModuleRejected:
    return ModuleRejected("ENOEXEC", f"{why}")


def _table(elf: Elf, read: ReadAt) -> tuple[Section, bytes, bytes] | None:
    symtab = next((s for s in elf.sections[1:] if s.type == SHT_SYMTAB), None)
    if symtab is None or symtab.type == SHT_NOBITS:
        return None
    if symtab.size > MAX_SYMTAB:
        raise _fail(f"symbol table of {symtab.size} bytes")
    strings = elf.sections[symtab.link]
    if strings.size > MAX_SYMTAB:
        raise _fail(f"symbol string table of {strings.size} bytes")
    data = read(symtab.offset, symtab.size - symtab.size % _SYM.size)
    names = read(strings.offset, strings.size) if strings.type != SHT_NOBITS else b""
    return symtab, data, names


def _name(names: bytes, at: int) -> bytes:
    end = names.find(b"\0", at)
    return names[at : len(names) if end < 0 else end]


def read_symbols(elf: Elf, read: ReadAt, *, exports_only: bool = False) -> Symbols:
    """The imports and exports of the module whose sections ``elf`` describes."""
    found = _table(elf, read)
    if found is None:
        return Symbols((), {}, None)
    _symtab, data, names = found
    wanted = {
        s.index: s
        for s in elf.sections
        if s.name in (*_EXPORT_SECTIONS, *_CRC_SECTIONS, _FLAGS_SECTION, b"__ksymtab_strings")
        and s.type != SHT_NOBITS
    }
    if exports_only and not any(s.name in _EXPORT_SECTIONS for s in wanted.values()):
        return Symbols((), {}, None)
    labels = _Labels(read)
    imports: list[Import] = []
    problem: tuple[int, str] | None = None
    shnum = len(elf.sections)
    for i, (name_at, info, _other, shndx, value, _size) in enumerate(_SYM.iter_unpack(data)):
        if i == 0:
            continue
        if shndx == SHN_UNDEF:
            if not exports_only:
                imports.append(Import(i, _name(names, name_at).decode("utf-8", "replace"),
                                      info >> 4 == STB_WEAK))  # fmt: skip
            continue
        if shndx == SHN_COMMON and not _name(names, name_at).startswith(b"__gnu_lto"):
            problem = (i, f"common symbol {_name(names, name_at).decode('utf-8', 'replace')}")
            continue
        if shndx in (SHN_ABS, SHN_LIVEPATCH):
            continue
        if shndx >= shnum:
            problem = (i, f"symbol {i} has an invalid section index {shndx}")
            continue
        sec = wanted.get(shndx)
        if sec is not None:
            labels.note(sec, _name(names, name_at), value)
    return Symbols(tuple(imports), labels.exports(), problem)


class _Labels:
    """The labels kbuild places in a module's export sections, gathered symbol by symbol:
    ``__ksymtab_<name>`` (an export, GPL-only in ``__ksymtab_gpl``), ``__crc_<name>``,
    ``__flags_<name>`` and ``__kstrtabns_<name>``."""

    def __init__(self, read: ReadAt) -> None:
        self.read = read
        self.contents: dict[int, bytes] = {}
        self.gpl: dict[bytes, bool] = {}
        self.in_gpl_section: set[bytes] = set()
        self.crcs: dict[bytes, int] = {}
        self.spaces: dict[bytes, bytes] = {}
        self.flags: dict[bytes, int] = {}

    def _body(self, sec: Section) -> bytes:
        if sec.index not in self.contents:
            self.contents[sec.index] = self.read(sec.offset, min(sec.size, MAX_TABLE))
        return self.contents[sec.index]

    def note(self, sec: Section, label: bytes, value: int) -> None:
        """Take the symbol ``label`` at ``value`` in section ``sec``."""
        if sec.name in _EXPORT_SECTIONS and label.startswith(b"__ksymtab_"):
            self.gpl[label[10:]] = sec.name == b"__ksymtab_gpl"
            if sec.name == b"__ksymtab_gpl":
                self.in_gpl_section.add(label[10:])
        elif sec.name in _CRC_SECTIONS and label.startswith(b"__crc_"):
            body = self._body(sec)
            if value + 4 <= len(body):
                self.crcs[label[6:]] = struct.unpack_from("<I", body, value)[0]
        elif sec.name == _FLAGS_SECTION and label.startswith(b"__flags_"):
            body = self._body(sec)
            if value < len(body):
                self.flags[label[8:]] = body[value]
        elif sec.name == b"__ksymtab_strings" and label.startswith(b"__kstrtabns_"):
            body = self._body(sec)
            self.spaces[label[12:]] = _name(body, value) if value < len(body) else b""

    def exports(self) -> dict[str, Export]:
        """Every export with its CRC, GPL-only flag (its section's or its flags byte's) and
        namespace."""
        gpl = dict(self.gpl)
        for name, flag in self.flags.items():
            if name in gpl:
                gpl[name] = gpl[name] or bool(flag & KSYM_FLAG_GPL_ONLY)
        return {
            name.decode("utf-8", "replace"): Export(
                self.crcs.get(name), only_gpl,
                self.spaces.get(name, b"").decode("utf-8", "replace"), "",
                name in self.in_gpl_section,
            )
            for name, only_gpl in gpl.items()
        }  # fmt: skip

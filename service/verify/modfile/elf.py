"""A module's ELF checked as Linux 6.1's loader checks it, before anything is read from it.

The reader is hand-written (pyelftools is ~18x slower and unnecessary) and follows
kernel/module/main.c in order: ``elf_validity_check`` (header, section table, section
name table, section 0, every section's extent, SHT_SYMTAB links, names of SHF_ALLOC
sections) and the section lookups of ``setup_load_info`` (``find_sec`` takes SHF_ALLOC
sections only, so a non-allocated section is invisible to it), and finds the W+X
section ``module_enforce_rwx_sections`` refuses. Like the kernel it reads the headers in
the host's byte order and does not look at ``EI_CLASS``/``EI_DATA`` or the name table's
type. Anything it refuses raises :class:`~service.errors.ModuleRejected` with ``ENOEXEC``.
What 6.4's and 6.12's validation refuse beyond that is recorded, not raised
(:attr:`Elf.problem_6_4`, :attr:`Elf.strict_problem`): the target's release decides
(:mod:`service.verify.loadrules`).
"""

from __future__ import annotations

import struct
from collections.abc import Callable
from dataclasses import dataclass
from typing import NamedTuple

from service.errors import ModuleRejected

ReadAt = Callable[[int, int], bytes]  # (offset, length) -> exactly length bytes

ET_REL = 1
SHT_NULL, SHT_SYMTAB, SHT_STRTAB, SHT_NOBITS = 0, 2, 3, 8
SHF_WRITE, SHF_ALLOC, SHF_EXECINSTR = 0x1, 0x2, 0x4
SHDR_SIZE = 64
MAX_TABLE = 16 << 20  # modstage policy: bound the strings and .modinfo read into memory
_SHDR = struct.Struct("<IIQQQQIIQQ")
_EHDR = struct.Struct("<HHIQQQIHHHHHH")


def rejected(why: str) -> ModuleRejected:
    """The kernel's refusal of a module's ELF: always ``ENOEXEC``."""
    return ModuleRejected("ENOEXEC", f"{why}")


@dataclass(frozen=True)
class Section:
    """One section header, and its name when the name table holds it."""

    index: int
    name: bytes | None
    type: int
    flags: int
    addr: int
    offset: int
    size: int
    link: int


class Elf(NamedTuple):
    """What ``elf_validity_check`` and ``setup_load_info`` establish about a module."""

    machine: int
    sections: tuple[Section, ...]
    # what 6.12's ELF validation (``elf_validity_cache_copy``) refuses and 6.1's lets by
    strict_problem: str | None = None
    # what 6.4's (``elf_validity_check``) refuses and 6.1's lets by
    problem_6_4: str | None = None

    def find_sec(self, name: bytes) -> Section | None:
        """The kernel's ``find_sec``: the first SHF_ALLOC section of that name."""
        for sec in self.sections[1:]:
            if sec.flags & SHF_ALLOC and sec.name == name:
                return sec
        return None

    def write_exec(self) -> Section | None:
        """The first section both writable and executable (``module_enforce_rwx_sections``)."""
        wx = SHF_WRITE | SHF_EXECINSTR
        return next((s for s in self.sections if s.flags & wx == wx), None)


def bounded(read_at: ReadAt, size: int) -> ReadAt:
    """``read_at`` limited to ``[0, size)``, refusing a short read (the file changed)."""

    def read(at: int, n: int) -> bytes:
        if at < 0 or n < 0 or at + n > size:
            raise rejected(f"ELF reference [{at}, +{n}) outside the {size}-byte module")
        data = read_at(at, n)
        if len(data) != n:
            raise rejected("module shorter than its size (changed while read?)")
        return data

    return read


def parse_elf(read_at: ReadAt, size: int, machine: int | None = None) -> Elf:
    """``elf_validity_check`` and the section lookups of ``setup_load_info``."""
    read = bounded(read_at, size)
    if size < 64:
        raise rejected("too short for an ELF header")
    header = read(0, 64)
    if header[:4] != b"\x7fELF":
        raise rejected("not an ELF file")
    e_type, e_machine, *_, shoff, _fl, _eh, _pe, _pn, shentsize, shnum, shstrndx = (
        _EHDR.unpack_from(header, 16)
    )
    if e_type != ET_REL:
        raise rejected(f"ELF type {e_type} is not a relocatable object")
    if machine is not None and e_machine != machine:
        raise rejected(f"ELF machine {e_machine} is not the target's ({machine})")
    if shentsize != SHDR_SIZE:
        raise rejected(f"section header size {shentsize} is not {SHDR_SIZE}")
    if shoff >= size or shnum * SHDR_SIZE > size - shoff:
        raise rejected("section header table outside the module")
    if shstrndx == 0 or shstrndx >= shnum:
        raise rejected("bad section name table index")
    table = read(shoff, shnum * SHDR_SIZE)
    raw = [_SHDR.unpack_from(table, i * SHDR_SIZE) for i in range(shnum)]
    _n, _t, _f, _a, str_off, str_len, *_ = raw[shstrndx]
    if str_off + str_len > size:
        raise rejected("section name table outside the module")
    if str_len == 0 or str_len > MAX_TABLE:
        raise rejected(f"section name table of {str_len} bytes")
    strtab = read(str_off, str_len)
    if strtab[-1] != 0:
        raise rejected("section name table is not NUL-terminated")
    if raw[0][1] != SHT_NULL or raw[0][5] != 0 or raw[0][3] != 0:
        raise rejected("section 0 is not an empty SHT_NULL section")
    sections = []
    for i, (sh_name, sh_type, flags, addr, offset, length, link, *_) in enumerate(raw):
        if i and sh_type not in (SHT_NULL, SHT_NOBITS):
            if sh_type == SHT_SYMTAB and (link == 0 or link >= shnum):
                raise rejected(f"symbol table {i} links to section {link}")
            if offset + length > size:
                raise rejected(f"section {i} lies outside the module")
            if flags & SHF_ALLOC and sh_name >= str_len:
                raise rejected(f"allocated section {i} has its name outside the name table")
        name = strtab[sh_name : strtab.index(b"\0", sh_name)] if sh_name < str_len else None
        sections.append(Section(i, name, sh_type, flags, addr, offset, length, link))
    found = tuple(sections)
    return Elf(e_machine, found, _strict_problem(found, raw[shstrndx][1]), _problem_6_4(found))


def _problem_6_4(sections: tuple[Section, ...]) -> str | None:
    """The first thing Linux 6.4's ``elf_validity_check`` refuses (ENOEXEC) that 6.1's does
    not (torvalds/linux "module: move more elf validity checks to elf_validity_check()" and
    "module: add sanity check for ELF module section", merged for 6.4-rc1). Its loop counts
    sections by name, skipping SHT_NULL and SHT_NOBITS ones: more than one ``.modinfo``,
    not exactly one ``.gnu.linkonce.this_module`` or one not SHF_ALLOC, not exactly one
    symbol table. (The size of ``this_module``: :mod:`service.verify.loadrules`.)"""
    counted = [s for s in sections[1:] if s.type not in (SHT_NULL, SHT_NOBITS)]
    if sum(s.name == b".modinfo" for s in counted) > 1:
        return "more than one .modinfo section"
    mods = [s for s in counted if s.name == b".gnu.linkonce.this_module"]
    if len(mods) != 1:
        return f"{len(mods)} .gnu.linkonce.this_module sections with contents, not exactly one"
    if not mods[0].flags & SHF_ALLOC:
        return ".gnu.linkonce.this_module is not allocated"
    symtabs = sum(s.type == SHT_SYMTAB for s in counted)
    if symtabs != 1:
        return f"{symtabs} symbol tables, not exactly one"
    return None


def _strict_problem(sections: tuple[Section, ...], strtab_type: int) -> str | None:
    """The first thing Linux 6.12's ``elf_validity_cache_copy`` refuses (ENOEXEC) that
    6.1's ``elf_validity_check`` does not: the name table's type, every name (not only
    allocated sections'), one ``.modinfo``, exactly one allocated, sized
    ``.gnu.linkonce.this_module``, exactly one symbol table linked to a string table."""
    if strtab_type != SHT_STRTAB:
        return f"section name table of type {strtab_type}, not SHT_STRTAB"
    unnamed = next((s for s in sections[1:] if s.type != SHT_NULL and s.name is None), None)
    if unnamed is not None:
        return f"section {unnamed.index} has its name outside the name table"
    if sum(s.name == b".modinfo" for s in sections[1:]) > 1:
        return "more than one .modinfo section"
    mods = [s for s in sections[1:] if s.name == b".gnu.linkonce.this_module"]
    if len(mods) != 1:
        return f"{len(mods)} .gnu.linkonce.this_module sections, not exactly one"
    if mods[0].type == SHT_NOBITS or not mods[0].flags & SHF_ALLOC:
        return ".gnu.linkonce.this_module is not allocated with a size"
    symtabs = [s for s in sections[1:] if s.type == SHT_SYMTAB]
    if len(symtabs) != 1:
        return f"{len(symtabs)} symbol tables, not exactly one"
    link = symtabs[0].link
    if link >= len(sections) or sections[link].type != SHT_STRTAB:
        return f"the symbol table links to section {link}, not a string table"
    return None

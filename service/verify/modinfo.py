"""A module's identity from its ELF ``.modinfo`` section, and the kernel's vermagic rule.

The reader is hand-written (pyelftools is ~18x slower and unnecessary): ELF header,
section header table, section name table, ``.modinfo``. Every offset and size is checked
against the signed length before it is used, in the spirit of the kernel's
``elf_validity_check``; anything malformed raises
:class:`~service.errors.ModuleRejected` with ``ENOEXEC``, as ``finit_module`` would.
"""

from __future__ import annotations

import re
import struct
from collections.abc import Callable
from dataclasses import dataclass

from service.errors import ModuleRejected

ReadAt = Callable[[int, int], bytes]  # (offset, length) -> exactly length bytes

ET_REL = 1
SHT_NULL, SHT_STRTAB, SHT_NOBITS = 0, 3, 8
SHDR_SIZE = 64
MAX_TABLE = 16 << 20  # modstage policy: bound the strings and .modinfo read into memory
MULTI = ("alias", "parm", "parmtype", "firmware", "softdep", "import_ns", "weakdep")


def _fail(why: str) -> ModuleRejected:
    return ModuleRejected(f"ENOEXEC: {why}")


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
    has_versions: bool  # a ``__versions`` section: modversions CRCs, relaxes vermagic
    machine: int  # e_machine
    fields: tuple[tuple[str, str], ...]  # every key=value, in file order

    @classmethod
    def from_bytes(cls, data: bytes) -> ModInfo:
        """Parse an in-memory ELF (e.g. a decompressed module)."""
        return cls.from_elf(lambda at, n: data[at : at + n], len(data))

    @classmethod
    def from_elf(cls, read_at: ReadAt, size: int) -> ModInfo:
        """Parse the ELF64 object held in ``[0, size)`` of whatever ``read_at`` reads."""

        def read(at: int, n: int) -> bytes:
            if at < 0 or n < 0 or at + n > size:
                raise _fail(f"ELF reference [{at}, +{n}) outside the {size}-byte module")
            data = read_at(at, n)
            if len(data) != n:
                raise _fail("module shorter than its size (changed while read?)")
            return data

        if size < 64:
            raise _fail("too short for an ELF header")
        header = read(0, 64)
        if header[:4] != b"\x7fELF":
            raise _fail("not an ELF file")
        if header[4] != 2 or header[5] not in (1, 2):
            raise _fail("not a 64-bit ELF object")
        end = "<" if header[5] == 1 else ">"
        (
            e_type,
            machine,
            _v,
            _entry,
            _phoff,
            shoff,
            _flags,
            _ehsize,
            _phentsize,
            _phnum,
            shentsize,
            shnum,
            shstrndx,
        ) = struct.unpack_from(end + "HHIQQQIHHHHHH", header, 16)
        if e_type != ET_REL:
            raise _fail(f"ELF type {e_type} is not a relocatable object")
        if shentsize != SHDR_SIZE or shoff >= size or shnum * SHDR_SIZE > size - shoff:
            raise _fail("section header table outside the module")
        if shstrndx == 0 or shstrndx >= shnum:
            raise _fail("bad section name table index")
        table = read(shoff, shnum * SHDR_SIZE)
        sections = [
            struct.unpack_from(end + "IIQQQQIIQQ", table, i * SHDR_SIZE) for i in range(shnum)
        ]
        for _name, sh_type, _f, _a, offset, length, *_ in sections:
            if sh_type not in (SHT_NULL, SHT_NOBITS) and offset + length > size:
                raise _fail("a section lies outside the module")
        _n, str_type, _f, _a, str_off, str_len, *_ = sections[shstrndx]
        if str_type != SHT_STRTAB or str_len == 0 or str_len > MAX_TABLE:
            raise _fail("bad section name table")
        strtab = read(str_off, str_len)
        if strtab[-1] != 0:
            raise _fail("section name table is not NUL-terminated")
        names: dict[bytes, tuple[int, int, int]] = {}
        for sh_name, sh_type, _f, _a, offset, length, *_ in sections:
            if sh_name >= str_len:
                raise _fail("section name outside the name table")
            name = strtab[sh_name : strtab.index(b"\0", sh_name)]
            names.setdefault(name, (sh_type, offset, length))
        if b".gnu.linkonce.this_module" not in names:
            raise _fail("no module found in object (.gnu.linkonce.this_module)")
        if b".modinfo" not in names:
            raise _fail("no .modinfo section (so no vermagic)")
        mi_type, mi_off, mi_len = names[b".modinfo"]
        if mi_type == SHT_NOBITS or mi_len > MAX_TABLE:
            raise _fail("bad .modinfo section")
        return cls.from_fields(_fields(read(mi_off, mi_len)), machine, b"__versions" in names)

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


def check_vermagic(info: ModInfo, kernel: str) -> None:
    """Refuse a module whose vermagic does not fit ``kernel``.

    ``kernel`` is a release (``6.1.0-57-amd64``) or the target kernel's full vermagic
    (``"6.1.0-57-amd64 SMP preempt mod_unload modversions "``, compared with
    :func:`same_magic`). Either way the release word must equal the target's: with
    modversions the kernel would fall back to symbol CRCs that modstage cannot see
    before the reboot, so a module built for another release is refused by policy.
    """
    if info.vermagic is None:
        raise ModuleRejected("ENOEXEC: no vermagic in .modinfo")
    release = kernel.split(" ", 1)[0]
    built_for = info.vermagic.split(" ", 1)[0]
    if " " in kernel and not same_magic(info.vermagic, kernel, info.has_versions):
        raise ModuleRejected(f"ENOEXEC: vermagic {info.vermagic!r} does not match {kernel!r}")
    if built_for != release:
        raise ModuleRejected(f"ENOEXEC: vermagic is for kernel {built_for}, not {release}")


def kernel_version(release: str) -> tuple[int, int]:
    """(major, minor) of a release string; unknown shapes count as newest."""
    match = re.match(r"(\d+)\.(\d+)", release)
    return (int(match[1]), int(match[2])) if match else (99, 0)

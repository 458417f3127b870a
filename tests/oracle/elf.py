"""In-place edits of an ELF64 little-endian relocatable module (headers and section headers)."""

from __future__ import annotations

import struct

SHDR = struct.Struct("<IIQQQQIIQQ")  # name type flags addr offset size link info align entsize
SHDR_FIELDS = (
    "name",
    "type",
    "flags",
    "addr",
    "offset",
    "size",
    "link",
    "info",
    "align",
    "entsize",
)
EHDR_FIELDS = {"type": (16, "<H"), "machine": (18, "<H"), "shentsize": (58, "<H"),
               "shnum": (60, "<H"), "shstrndx": (62, "<H"), "shoff": (40, "<Q")}  # fmt: skip
SHF_WRITE, SHF_ALLOC, SHF_EXECINSTR = 1, 2, 4


def _shoff(elf: bytes) -> int:
    return int(struct.unpack_from("<Q", elf, 40)[0])


def sections(elf: bytes) -> list[dict[str, int | str]]:
    """Every section header as a dict (fields of SHDR_FIELDS plus its `label`)."""
    shoff, shnum, shstrndx = _shoff(elf), *struct.unpack_from("<HH", elf, 60)
    headers = [
        dict(zip(SHDR_FIELDS, SHDR.unpack_from(elf, shoff + i * SHDR.size), strict=True))
        for i in range(shnum)
    ]
    strtab = int(headers[shstrndx]["offset"])
    for header in headers:
        start = strtab + int(header["name"])
        header["label"] = elf[start : elf.index(b"\0", start)].decode()
    return headers  # type: ignore[return-value]


def index_of(elf: bytes, label: str) -> int:
    """The index of the first section called `label`."""
    for i, header in enumerate(sections(elf)):
        if header["label"] == label:
            return i
    raise KeyError(label)


def set_section(elf: bytes, label: str | int, **fields: int) -> bytes:
    """`elf` with fields of one section header (by name or index) replaced."""
    index = label if isinstance(label, int) else index_of(elf, label)
    at = _shoff(elf) + index * SHDR.size
    values = dict(zip(SHDR_FIELDS, SHDR.unpack_from(elf, at), strict=True))
    values.update(fields)
    out = bytearray(elf)
    SHDR.pack_into(out, at, *values.values())
    return bytes(out)


def section_flags(elf: bytes, label: str) -> int:
    """sh_flags of the section called `label`."""
    return int(sections(elf)[index_of(elf, label)]["flags"])


def set_header(elf: bytes, field: str, value: int) -> bytes:
    """`elf` with one ELF header field (see EHDR_FIELDS) replaced."""
    offset, fmt = EHDR_FIELDS[field]
    out = bytearray(elf)
    struct.pack_into(fmt, out, offset, value)
    return bytes(out)


def set_ident(elf: bytes, index: int, value: int) -> bytes:
    """`elf` with e_ident[index] replaced (4 = EI_CLASS, 5 = EI_DATA, 6 = EI_VERSION, 7 = OSABI)."""
    out = bytearray(elf)
    out[index] = value
    return bytes(out)


def section_data(elf: bytes, label: str) -> tuple[int, int]:
    """(file offset, size) of the section called `label`."""
    header = sections(elf)[index_of(elf, label)]
    return int(header["offset"]), int(header["size"])


def flip_version_crc(payload: bytes, symbol: bytes | None) -> bytes:
    """Flip the CRC of `symbol` in __versions (None: the first entry not module_layout)."""
    offset, size = section_data(payload, "__versions")
    out = bytearray(payload)
    for at in range(offset, offset + size, 64):
        name = payload[at + 8 : at + 64].split(b"\0")[0]
        if (symbol is None and name != b"module_layout") or name == symbol:
            struct.pack_into("<Q", out, at, struct.unpack_from("<Q", payload, at)[0] ^ 0x5A5A)
            return bytes(out)
    raise KeyError(symbol)


SYM = struct.Struct("<IBBHQQ")  # name info other shndx value size
STB_GLOBAL, STB_WEAK = 1, 2


def _symbol_names(elf: bytes) -> list[tuple[bytes, int, int, int]]:
    """(name, file offset of the name, st_info, st_shndx) of every .symtab entry."""
    headers = sections(elf)
    symtab = headers[index_of(elf, ".symtab")]
    strtab = int(headers[int(symtab["link"])]["offset"])
    out = []
    for at in range(int(symtab["offset"]), int(symtab["offset"]) + int(symtab["size"]), SYM.size):
        name, info, _, shndx, _, _ = SYM.unpack_from(elf, at)
        start = strtab + name
        out.append((elf[start : elf.index(b"\0", start)], start, info, shndx))
    return out


def undefined_symbols(elf: bytes) -> dict[bytes, int]:
    """The module's imports: name -> binding (STB_GLOBAL, STB_WEAK) of each named SHN_UNDEF
    symbol."""
    return {name: info >> 4 for name, _, info, shndx in _symbol_names(elf) if name and shndx == 0}


def rename_symbol(elf: bytes, old: bytes, new: bytes) -> bytes:
    """`elf` with the symbol `old` renamed `new` (same length) in its string table; fails if
    the name is shared with another symbol (a merged string tail)."""
    assert len(old) == len(new), (old, new)
    names = _symbol_names(elf)
    starts = {start for name, start, _, _ in names if name == old}
    assert len(starts) == 1, f"{old!r}: {len(starts)} names"
    (start,) = starts
    out = bytearray(elf)
    out[start : start + len(new)] = new
    changed = {a for a, b in zip(names, _symbol_names(bytes(out)), strict=True) if a[0] != b[0]}
    assert {name for name, _, _, _ in changed} == {old}, f"{old!r} shares its bytes"
    return bytes(out)


def versions(elf: bytes) -> dict[bytes, int]:
    """The __versions entries: symbol name -> CRC."""
    offset, size = section_data(elf, "__versions")
    return {
        elf[at + 8 : at + 64].split(b"\0")[0]: int(struct.unpack_from("<Q", elf, at)[0])
        for at in range(offset, offset + size, 64)
    }


def has_section(elf: bytes, label: str) -> bool:
    """Whether `elf` has a section called `label`."""
    return any(header["label"] == label for header in sections(elf))


def rename_version(elf: bytes, old: bytes, new: bytes) -> bytes:
    """`elf` with the __versions entry of `old` renamed `new` (same length)."""
    assert len(old) == len(new), (old, new)
    offset, size = section_data(elf, "__versions")
    for at in range(offset, offset + size, 64):
        if elf[at + 8 : at + 64].split(b"\0")[0] == old:
            return elf[: at + 8] + new + elf[at + 8 + len(new) :]
    raise KeyError(old)


def replace_in_section(elf: bytes, label: str, old: bytes, new: bytes) -> bytes:
    """`elf` with the one occurrence of `old` inside section `label` replaced by `new` (same
    length)."""
    assert len(old) == len(new), (old, new)
    offset, size = section_data(elf, label)
    data = elf[offset : offset + size]
    assert data.count(old) == 1, f"{old!r} occurs {data.count(old)} times in {label}"
    at = offset + data.index(old)
    return elf[:at] + new + elf[at + len(old) :]


def rename_section(elf: bytes, label: str, new: str) -> bytes:
    """`elf` with section `label` called `new`. The name is written over that of a section
    the loader never looks up (not allocated, its name shared with no other section's, long
    enough), whose sections are then named "" (`.shstrtab` keeps its size)."""
    headers = sections(elf)
    shstrtab = int(headers[struct.unpack_from("<H", elf, 62)[0]]["offset"])
    spans = [(int(h["name"]), int(h["name"]) + len(str(h["label"]))) for h in headers]
    for donor in headers:
        start, end = int(donor["name"]), int(donor["name"]) + len(str(donor["label"]))
        alone = all(s == start or e < start or s > end for s, e in spans)
        if int(donor["flags"]) & SHF_ALLOC or not alone or end - start < len(new) or not start:
            continue
        out = bytearray(elf)
        out[shstrtab + start : shstrtab + end] = new.encode().ljust(end - start, b"\0")
        for i, header in enumerate(headers):
            if int(header["name"]) == start:
                SHDR.pack_into(out, _shoff(elf) + i * SHDR.size,
                               *(0 if f == "name" else header[f] for f in SHDR_FIELDS))  # fmt: skip
        return set_section(bytes(out), index_of(elf, label), name=start)
    raise ValueError(f"no section name to take over for {new}")

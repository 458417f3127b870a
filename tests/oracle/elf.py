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

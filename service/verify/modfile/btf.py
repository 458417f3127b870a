"""A module's ``.BTF``, checked as ``btf_parse_module`` begins to check it (kernel/bpf/btf.c).

A kernel built with ``CONFIG_DEBUG_INFO_BTF_MODULES`` parses the first section named
``.BTF`` of a module as it comes (``btf_module_notify``), as split BTF over its own. Without
``CONFIG_MODULE_ALLOW_BTF_MISMATCH`` a parse failure refuses the module with the parser's
errno (EINVAL, E2BIG, or the kernel-internal ENOTSUPP, 524); with it the kernel warns and
loads the module. :func:`btf_problem` mirrors the parser's first steps: the header
(``btf_parse_hdr``), the sections' layout (``btf_check_sec_info``) and the string section
(``btf_parse_str_sec``). The type section's checks against the kernel's own BTF
(``btf_check_all_metas``) are not mirrored: a module whose types do not match may pass here
and be refused by such a kernel. Debian 12's 6.1 and 13's 6.12 set
``CONFIG_MODULE_ALLOW_BTF_MISMATCH``; sid's 7.2 does not.
"""

from __future__ import annotations

import struct
from collections.abc import Callable

MAGIC = 0xEB9F  # BTF_MAGIC, in the target's byte order (little-endian x86-64)
VERSION = 1  # BTF_VERSION
HEADER = 24  # sizeof(struct btf_header): magic, version, flags, hdr_len, 2 x (off, len)
MAX_NAME_OFFSET = 0x00FFFFFF  # BTF_MAX_NAME_OFFSET
_U32 = 0xFFFFFFFF

Read = Callable[[int, int], bytes]  # read(offset, length) within the section


def btf_problem(read: Read, size: int) -> tuple[str, str] | None:
    """``(errno, words)`` for a ``.BTF`` of ``size`` bytes that ``btf_parse_module``'s
    first steps refuse, or None."""
    if size < 8:
        return "EINVAL", "hdr_len not found"
    raw_len = struct.unpack("<I", read(4, 4))[0]
    if size < raw_len:
        return "EINVAL", "btf_header not found"
    if raw_len > HEADER and any(read(HEADER, raw_len - HEADER)):
        return "E2BIG", "unsupported btf_header (non-zero bytes past the known header)"
    head = read(0, min(raw_len, HEADER)).ljust(HEADER, b"\0")  # copied into a zeroed header
    magic, version, flags, hdr_len, type_off, type_len, str_off, str_len = struct.unpack(
        "<HBBIIIII", head
    )
    if magic != MAGIC:
        return "EINVAL", "invalid magic"
    if version != VERSION or flags:
        return "ENOTSUPP", f"unsupported version {version} or flags {flags:#x}"
    layout = _layout(size, hdr_len, ((type_off, type_len), (str_off, str_len)))
    if layout is not None:
        return "EINVAL", layout
    end = hdr_len + str_off + str_len
    if end != size:
        return "EINVAL", "the string section is not at the end"
    if str_len and (str_len - 1 > MAX_NAME_OFFSET or read(end - 1, 1) != b"\0"):
        return "EINVAL", "invalid string section"
    return None


def _layout(size: int, hdr_len: int, sections: tuple[tuple[int, int], ...]) -> str | None:
    """``btf_check_sec_info``: the sections, by offset, tile the data after the header."""
    expected = (size - hdr_len) & _U32
    total = 0
    for off, length in sorted(sections):
        if expected < off:
            return "invalid section offset"
        if total != off:
            return "an unsupported section found" if total < off else "sections overlap"
        if expected - total < length:
            return "total section length too long"
        total += length
    return None if total == expected else "an unsupported section found"

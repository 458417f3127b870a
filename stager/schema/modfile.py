"""What ``modstage stage`` takes for a kernel module file, judged by its first bytes.

A module is an ELF relocatable object, stored plain or compressed (xz, zstd, gzip: the
suffix names the compression; under a plain ``.ko`` name the host tells the format by
content, and so does this check). A compressed file's payload must be a module, too: just
enough of its start is decompressed to see the ELF header, at most :data:`HEAD` bytes of
output from at most :data:`MAX_INPUT` bytes read, never the whole file. xz and gzip use the
standard library; zstd needs the optional ``zstandard`` package (the container side runs
with the standard library and tomli-w alone): without it a ``.ko.zst`` is accepted by its
magic, and :func:`payload_head` raises :class:`Unchecked` to say so.
"""

from __future__ import annotations

import lzma
import zlib
from collections.abc import Callable
from typing import BinaryIO, cast

from stager.schema.paths import MODULE_SUFFIXES

HEAD = 64  # bytes of the payload judged: an ELF header is 52 (32-bit) or 64 bytes
MAX_INPUT = 256 << 10  # compressed bytes read at most to reach them (a zstd block: 128 KiB)
CHUNK = 4 << 10
ET_REL = 1  # a kernel module is a relocatable ELF object

#: What each compressed module suffix's file starts with.
MAGIC = {".ko.xz": b"\xfd7zXZ\x00", ".ko.zst": b"\x28\xb5\x2f\xfd", ".ko.gz": b"\x1f\x8b"}


class Unchecked(Exception):
    """The payload cannot be checked here (``zstandard`` is not installed)."""


def compression(head: bytes, name: str) -> tuple[str | None, str | None]:
    """``(suffix of the compression or None for a plain ELF file, problem or None)`` of a
    file whose first bytes are ``head`` and whose name is ``name``."""
    for suffix, magic in MAGIC.items():
        if name.endswith(suffix):
            return (suffix, None) if head.startswith(magic) else (suffix, "wrong magic")
    if not name.endswith(".ko"):
        return None, f"not a module file name (it must end in {', '.join(MODULE_SUFFIXES)})"
    for suffix, magic in MAGIC.items():
        if head.startswith(magic):
            return suffix, None  # compressed under a .ko name: the host tells it by content
    return None, None


def elf_problem(head: bytes) -> str | None:
    """Why an (uncompressed) file starting with ``head`` is not a kernel module, or None."""
    if len(head) < 18 or not head.startswith(b"\x7fELF"):
        return "not an ELF file (a kernel module is an ELF relocatable object)"
    e_type = head[16:18] if head[5] == 1 else head[17:15:-1]  # EI_DATA: 1 little, 2 big
    if head[5] not in (1, 2) or int.from_bytes(e_type, "little") != ET_REL:
        return "an ELF file but not a relocatable object: not a kernel module"
    return None


def payload_head(f: BinaryIO, suffix: str) -> bytes:
    """The first :data:`HEAD` bytes (fewer if the payload is shorter) of the compressed file
    ``f``, reading at most :data:`MAX_INPUT` bytes of it; :class:`ValueError` if the stream
    is corrupt, :class:`Unchecked` if this Python cannot decompress it."""
    return _READERS[suffix](_Bounded(f))


class _Bounded:
    """``f`` as a reader that ends after :data:`MAX_INPUT` bytes."""

    def __init__(self, f: BinaryIO) -> None:
        self.f = f
        self.left = MAX_INPUT

    def read(self, size: int = -1) -> bytes:
        """At most ``size`` bytes, never past :data:`MAX_INPUT` in all."""
        size = self.left if size < 0 else min(size, self.left)
        data = self.f.read(size)
        self.left -= len(data)
        return data


def _xz(f: _Bounded) -> bytes:
    d = lzma.LZMADecompressor(format=lzma.FORMAT_XZ)
    return _pump(f, lambda data, room: d.decompress(data, max_length=room), lambda: d.eof)


def _gz(f: _Bounded) -> bytes:
    d = zlib.decompressobj(wbits=16 + zlib.MAX_WBITS)
    tail = b""

    def step(data: bytes, room: int) -> bytes:
        nonlocal tail
        out = d.decompress(tail + data, room)
        tail = d.unconsumed_tail
        return out

    return _pump(f, step, lambda: d.eof)


def _pump(f: _Bounded, step: Callable[[bytes, int], bytes], eof: Callable[[], bool]) -> bytes:
    """Feed ``f`` to ``step`` in chunks until :data:`HEAD` bytes are out or the stream ends
    (its end, or the bound's)."""
    out = b""
    try:
        while len(out) < HEAD and not eof():
            data = f.read(CHUNK)
            got = step(data, HEAD - len(out))
            out += got
            if not data and not got:
                break  # no more input and nothing buffered
    except (lzma.LZMAError, zlib.error, EOFError) as exc:
        raise ValueError(f"corrupt compressed data ({exc})") from exc
    return out


def _zst(f: _Bounded) -> bytes:
    try:
        import zstandard  # optional: absent in a bare container
    except ImportError as exc:
        raise Unchecked("the zstandard package is not installed") from exc
    reader = zstandard.ZstdDecompressor().stream_reader(
        cast(BinaryIO, f), read_size=CHUNK
    )  # read() is all it calls
    out = b""
    try:
        while len(out) < HEAD and (got := reader.read(HEAD - len(out))):
            out += got
    except zstandard.ZstdError as exc:
        raise ValueError(f"corrupt compressed data ({exc})") from exc
    return out


_READERS: dict[str, Callable[[_Bounded], bytes]] = {".ko.xz": _xz, ".ko.gz": _gz, ".ko.zst": _zst}

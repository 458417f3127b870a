"""What a compressed module says about itself before it is decompressed: its size, its window.

Each format may state the decompressed size: the xz index (at the end of the file), a
zstd frame's content size (in its header), gzip's ISIZE (the last four bytes, modulo
2**32). A stated size over the cap is refused without decompressing anything; a size
under it proves nothing (the file is the container's), so decompression keeps its
streaming cap. The window is the memory the decompressor will hold (xz's dictionary,
zstd's window, deflate's 32 KiB): it is what :mod:`service.verify.compressed.budget` admits, and the
decompressor is held to it (a later block or frame asking for more is refused).

Only the first stream (xz), frame (zstd) or member (gzip) is the module: bytes after it
are refused by :mod:`service.verify.compressed.decompress`. Headers that cannot be parsed here
state nothing, and the decompressor says what is wrong with them.
"""

from __future__ import annotations

import struct
from typing import BinaryIO, NamedTuple

#: The largest window modstage lets a decompressor hold: ``xz -9`` (64 MiB dictionary)
#: and zstd's own default limit (``--long``, ``--ultra -22``: 128 MiB) fit.
MAX_WINDOW = 128 << 20
GZIP_WINDOW = 32 << 10
DEFLATE_RATIO = 1032
XZ_HEADER = 12
LZMA2 = 0x21
MAX_XZ_STEPS = 4096  # streams and words of padding walked back over at most


class Stated(NamedTuple):
    """What the header says: decompressed bytes (None: not stated) and the window."""

    size: int | None
    window: int


def stated(f: BinaryIO, kind: str) -> Stated:
    """What the compressed file open in ``f`` (of ``kind``) states; reads a few KiB."""
    size = f.seek(0, 2)
    f.seek(0)
    head = f.read(min(size, 64 << 10))
    if kind == "zst":
        return _zstd(head)
    if kind == "gz":
        if size < 18:
            return Stated(None, GZIP_WINDOW)
        f.seek(size - 4)
        isize = struct.unpack("<I", f.read(4))[0]
        # deflate makes at most 1032 bytes of one: a larger ISIZE is no trailer (a file
        # cut short ends in compressed data), and the stream says what is wrong
        return Stated(isize if isize <= DEFLATE_RATIO * size else None, GZIP_WINDOW)
    return Stated(_xz_size(f, size), _xz_window(head))


def _zstd(head: bytes) -> Stated:
    import zstandard

    try:
        params = zstandard.get_frame_parameters(head)
    except zstandard.ZstdError:
        return Stated(None, MAX_WINDOW)
    known = params.content_size != zstandard.CONTENTSIZE_UNKNOWN
    # a single-segment frame has no window field: its window is its content size
    window = params.window_size or (params.content_size if known else MAX_WINDOW)
    return Stated(params.content_size if known else None, max(1, window))


def _varint(data: bytes, at: int) -> tuple[int, int]:
    """xz's multibyte integer at ``at``: (value, offset after it); ValueError if cut."""
    value = shift = 0
    for i in range(9):
        byte = data[at + i]
        value |= (byte & 0x7F) << shift
        shift += 7
        if not byte & 0x80:
            return value, at + i + 1
    raise ValueError("xz integer longer than 9 bytes")


def _xz_window(head: bytes) -> int:
    """The LZMA2 dictionary size in the first block's header (MAX_WINDOW if not found)."""
    try:
        at = XZ_HEADER
        end = at + (head[at] + 1) * 4
        flags = head[at + 1]
        at += 2
        for present in (flags & 0x40, flags & 0x80):  # compressed, uncompressed sizes
            if present:
                _, at = _varint(head, at)
        for _ in range((flags & 3) + 1):
            filter_id, at = _varint(head, at)
            props, at = _varint(head, at)
            if filter_id == LZMA2 and props == 1 and at < end:
                bits = head[at] & 0x3F
                return 0xFFFFFFFF if bits >= 40 else (2 | (bits & 1)) << (bits // 2 + 11)
            at += props
    except (IndexError, ValueError):
        pass
    return MAX_WINDOW


def _xz_size(f: BinaryIO, size: int) -> int | None:
    """The first stream's uncompressed size from its index, walking back over every
    stream of the file (and the zero padding between them); None if it does not parse."""
    end = size
    first: int | None = None
    try:
        for _ in range(MAX_XZ_STEPS):  # past it (a file of zeros): nothing stated
            if end <= 0:
                return first
            if end < 4:  # neither padding nor a stream; a file's seek before its start fails
                return None
            f.seek(end - 4)
            if f.read(4) == bytes(4):  # stream padding
                end -= 4
                continue
            first, end = _xz_stream(f, end)
    except (IndexError, ValueError, struct.error):
        return None
    return None


def _xz_stream(f: BinaryIO, end: int) -> tuple[int, int]:
    """(uncompressed size, offset of its start) of the xz stream ending at ``end``."""
    if end < 2 * XZ_HEADER:
        raise ValueError("too short for an xz stream")
    f.seek(end - XZ_HEADER)
    footer = f.read(XZ_HEADER)
    if footer[10:] != b"YZ":
        raise ValueError("no xz stream footer")
    index_size = (struct.unpack("<I", footer[4:8])[0] + 1) * 4
    if index_size > end - 2 * XZ_HEADER or index_size > 16 << 20:
        raise ValueError("xz index larger than the file")
    f.seek(end - XZ_HEADER - index_size)
    index = f.read(index_size)
    if index[0] != 0:
        raise ValueError("no xz index indicator")
    count, at = _varint(index, 1)
    if count > index_size // 2:
        raise ValueError("more xz index records than the index holds")
    blocks = total = 0
    for _ in range(count):
        unpadded, at = _varint(index, at)
        uncompressed, at = _varint(index, at)
        blocks += (unpadded + 3) & ~3
        total += uncompressed
    start = end - XZ_HEADER - index_size - blocks - XZ_HEADER
    if start < 0:
        raise ValueError("xz blocks larger than the file")
    return total, start

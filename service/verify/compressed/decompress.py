"""Compressed modules (``.ko.xz``, ``.ko.zst``, ``.ko.gz``), decompressed under a size cap.

kbuild compresses after signing, so the signature lies inside the decompressed ELF.
The format is told by magic bytes, once, by verification and boot alike; modstage always
decompresses in userspace (as kmod does) and the kernel gets the ELF, because Debian's
6.1 has no in-kernel decompression and no 6.1 decompresses zstd. Output is
produced in bounded steps, so a decompression bomb is stopped at the cap rather than
after it has filled memory; a stream that ends early or is followed by other bytes is
refused.
"""

from __future__ import annotations

import hashlib
import zlib
from collections.abc import Callable, Iterator
from typing import BinaryIO

from service.errors import ModuleRejected
from service.verify.compressed.stated import MAX_WINDOW
from stager.schema.modfile import MAGIC

MAX_DECOMPRESSED = 512 << 20
CHUNK = 1 << 20
ZSTD_FEED = 64  # zstd expands up to 32768x (an RLE block): 64 bytes make at most 2 MiB
ZSTD_BURST = ZSTD_FEED << 15
XZ_SLACK = 1 << 20  # liblzma's memory beyond the dictionary (its own state: ~30 KiB)

# the container's own table (what ``stage`` checks a compressed module's name against):
# ``(magic, "xz" | "zst" | "gz")``
MAGICS = tuple((magic, suffix.removeprefix(".ko.")) for suffix, magic in MAGIC.items())

Read = Callable[[int], bytes]  # read(n) -> up to n bytes, b"" at end of input


def compression(head: bytes) -> str | None:
    """``"xz"``, ``"zst"``, ``"gz"`` by magic, or None for anything else."""
    for magic, kind in MAGICS:
        if head.startswith(magic):
            return kind
    return None


class _Stream:
    """One decompressor behind a common face: feed input, take bounded output.

    ``window``: the most memory the decompressor may hold (xz's memory limit, zstd's
    largest window); a stream that asks for more is refused as corrupt.
    """

    def __init__(self, kind: str, window: int) -> None:
        self.kind = kind
        if kind == "xz":
            import lzma  # only xz modules pay for it (not the boot path's plain .ko)

            self._xz = lzma.LZMADecompressor(format=lzma.FORMAT_XZ, memlimit=window + XZ_SLACK)
        elif kind == "gz":
            self._gz = zlib.decompressobj(wbits=16 + zlib.MAX_WBITS)
        else:
            import zstandard  # only zstd modules pay for it (not the boot path's plain .ko)

            self._zst = zstandard.ZstdDecompressor(max_window_size=window).decompressobj()

    def feed(self, data: memoryview, limit: int) -> tuple[list[bytes], bytes]:
        """Decompress ``data``: (pieces of output, input left over). Output stops past
        ``limit`` bytes (zstd's, at most :data:`ZSTD_BURST` bytes past it)."""
        if self.kind == "xz":
            out = self._xz.decompress(data, max_length=limit)
            return [out], b"" if not self._xz.eof else self._xz.unused_data
        if self.kind == "gz":
            out = self._gz.decompress(data, limit)
            return [out], self._gz.unconsumed_tail if not self._gz.eof else self._gz.unused_data
        pieces, made, at = [], 0, 0
        while at < len(data) and made < limit and not self._zst.eof:
            piece = self._zst.decompress(data[at : at + ZSTD_FEED])
            at += ZSTD_FEED
            made += len(piece)
            pieces.append(piece)
        rest = self._zst.unused_data + bytes(data[at:]) if self._zst.eof else bytes(data[at:])
        return pieces, rest

    @property
    def pending(self) -> bool:
        """True while the decompressor holds output it has not returned yet."""
        if self.kind == "xz":
            return not self._xz.eof and not self._xz.needs_input
        return False

    @property
    def eof(self) -> bool:
        """True once the end of the compressed stream was seen."""
        if self.kind == "xz":
            return self._xz.eof
        if self.kind == "gz":
            return self._gz.eof
        return bool(self._zst.eof)


def _errors(kind: str) -> tuple[type[BaseException], ...]:
    errors: tuple[type[BaseException], ...] = (zlib.error, EOFError)
    if kind == "xz":
        import lzma

        errors += (lzma.LZMAError,)
    if kind == "zst":
        import zstandard

        errors += (zstandard.ZstdError,)
    return errors


def chunks(
    read: Read,
    kind: str,
    cap: int = MAX_DECOMPRESSED,
    *,
    exact: bool = True,
    window: int = MAX_WINDOW,
) -> Iterator[bytes]:
    """The stream ``read`` yields, decompressed, in pieces of at most :data:`CHUNK` bytes
    (:data:`ZSTD_BURST` for zstd, a few at a time); refuses more than ``cap`` bytes, a window over
    ``window`` bytes, and (``exact``) bytes after the end of the stream."""
    stream = _Stream(kind, window)
    done = 0
    buf, at = b"", 0  # the input read, and how much of it the decompressor took
    try:
        while not stream.eof:
            if at == len(buf) and not stream.pending:
                buf, at = read(CHUNK), 0
                if not buf:
                    raise ModuleRejected("EINVAL", f"truncated {kind} stream")
            data = memoryview(buf)[at:]
            pieces, rest = stream.feed(data, min(CHUNK, cap + 1 - done))
            at += len(data) - len(rest)
            for piece in pieces:
                done += len(piece)
                if done > cap:
                    raise ModuleRejected("EFBIG", f"decompressed module exceeds {cap} bytes")
                if piece:
                    yield piece
    except _errors(kind) as exc:
        raise ModuleRejected("EINVAL", f"corrupt {kind} stream: {exc}") from exc
    if exact and (at < len(buf) or read(CHUNK)):
        raise ModuleRejected(
            "EINVAL",
            f"data after the end of the {kind} stream "
            "(modstage decompresses in userspace and refuses it; the kernel never sees the stream)",
            policy=True,
        )


def decompress(read: Read, kind: str, cap: int = MAX_DECOMPRESSED, *, exact: bool = True) -> bytes:
    """All of the stream ``read`` yields, decompressed; refuses more than ``cap`` bytes.

    ``exact``: bytes after the end of the stream are refused (a module); else ignored (a
    kernel image's payload, which kbuild follows with padding and its size).
    """
    return b"".join(chunks(read, kind, cap, exact=exact))


class Hashed:
    """The stored (compressed) file's sha256, filled as :func:`decompress_file` reads it."""

    def __init__(self) -> None:
        self.sha256 = hashlib.sha256()

    def reader(self, f: BinaryIO) -> Read:
        """``f.read`` from its start, every byte read going through the digest too."""

        def read(n: int) -> bytes:
            data = f.read(n)
            self.sha256.update(data)
            return data

        f.seek(0)
        return read


def decompress_file(
    f: BinaryIO, kind: str, cap: int = MAX_DECOMPRESSED, hashed: Hashed | None = None
) -> bytes:
    """The module image of the compressed file open in ``f`` (read from its start); every
    byte of the file, the stream and what follows it, goes through ``hashed``, even when
    decompression is refused, so the stored file's digest is known either way."""
    read = (hashed or Hashed()).reader(f)
    try:
        return decompress(read, kind, cap)
    finally:
        while read(CHUNK):
            pass


def decompress_into(
    f: BinaryIO,
    kind: str,
    out: BinaryIO,
    *,
    cap: int = MAX_DECOMPRESSED,
    hashed: Hashed | None = None,
    window: int = MAX_WINDOW,
    count: Callable[[int], None] = lambda n: None,
) -> int:
    """Decompress the file open in ``f`` into ``out`` as it streams (never all of it in
    memory); the image's size. Every byte of ``f`` goes through ``hashed`` as in
    :func:`decompress_file`; ``count`` is told each piece's size first (and may refuse)."""
    read = (hashed or Hashed()).reader(f)
    size = 0
    try:
        for chunk in chunks(read, kind, cap, window=window):
            count(len(chunk))
            out.write(chunk)
            size += len(chunk)
    finally:
        while read(CHUNK):
            pass
    out.flush()
    return size

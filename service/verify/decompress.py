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
from collections.abc import Callable
from typing import BinaryIO

from service.errors import ModuleRejected

MAX_DECOMPRESSED = 512 << 20
CHUNK = 1 << 20
ZSTD_FEED = 1 << 10  # zstd expands up to ~32000x per input byte: feed it in small steps

MAGICS = (
    (b"\xfd7zXZ\x00", "xz"),
    (b"\x28\xb5\x2f\xfd", "zst"),
    (b"\x1f\x8b", "gz"),
)

Read = Callable[[int], bytes]  # read(n) -> up to n bytes, b"" at end of input


def compression(head: bytes) -> str | None:
    """``"xz"``, ``"zst"``, ``"gz"`` by magic, or None for anything else."""
    for magic, kind in MAGICS:
        if head.startswith(magic):
            return kind
    return None


class _Stream:
    """One decompressor behind a common face: feed input, take bounded output."""

    def __init__(self, kind: str) -> None:
        self.kind = kind
        if kind == "xz":
            import lzma  # only xz modules pay for it (not the boot path's plain .ko)

            self._xz = lzma.LZMADecompressor(format=lzma.FORMAT_XZ)
        elif kind == "gz":
            self._gz = zlib.decompressobj(wbits=16 + zlib.MAX_WBITS)
        else:
            import zstandard  # only zstd modules pay for it (not the boot path's plain .ko)

            self._zst = zstandard.ZstdDecompressor().decompressobj()

    def feed(self, data: bytes, limit: int) -> tuple[bytes, bytes]:
        """Decompress ``data``; returns (output of at most ``limit`` bytes, input left over)."""
        if self.kind == "xz":
            out = self._xz.decompress(data, max_length=limit)
            return out, b"" if not self._xz.eof else self._xz.unused_data
        if self.kind == "gz":
            out = self._gz.decompress(data, limit)
            return out, self._gz.unconsumed_tail if not self._gz.eof else self._gz.unused_data
        out = self._zst.decompress(data)
        return out, self._zst.unused_data if self._zst.eof else b""

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


def decompress(read: Read, kind: str, cap: int = MAX_DECOMPRESSED, *, exact: bool = True) -> bytes:
    """All of the stream ``read`` yields, decompressed; refuses more than ``cap`` bytes.

    ``exact``: bytes after the end of the stream are refused (a module); else ignored (a
    kernel image's payload, which kbuild follows with padding and its size).
    """
    stream = _Stream(kind)
    out = bytearray()
    queued = b""
    errors: tuple[type[BaseException], ...] = (zlib.error, EOFError)
    if kind == "xz":
        import lzma

        errors += (lzma.LZMAError,)
    if kind == "zst":
        import zstandard

        errors += (zstandard.ZstdError,)
    try:
        while not stream.eof:
            if not queued and not stream.pending:
                queued = read(CHUNK)
                if not queued:
                    raise ModuleRejected("EINVAL", f"truncated {kind} stream")
            step = ZSTD_FEED if kind == "zst" else len(queued)
            chunk, rest = stream.feed(queued[:step], cap + 1 - len(out))
            out += chunk
            queued = rest + queued[step:]
            if len(out) > cap:
                raise ModuleRejected("EFBIG", f"decompressed module exceeds {cap} bytes")
    except errors as exc:
        raise ModuleRejected("EINVAL", f"corrupt {kind} stream: {exc}") from exc
    if exact and (queued or read(CHUNK)):
        raise ModuleRejected(
            "EINVAL",
            f"data after the end of the {kind} stream "
            "(modstage decompresses in userspace and refuses it; the kernel never sees the stream)",
            policy=True,
        )
    return bytes(out)


class Hashed:
    """The stored (compressed) file's sha256, filled as :func:`decompress_file` reads it."""

    def __init__(self) -> None:
        self.sha256 = hashlib.sha256()


def decompress_file(
    f: BinaryIO, kind: str, cap: int = MAX_DECOMPRESSED, hashed: Hashed | None = None
) -> bytes:
    """The module image of the compressed file open in ``f`` (read from its start); every
    byte of the file, the stream and what follows it, goes through ``hashed``, even when
    decompression is refused, so the stored file's digest is known either way."""
    seen = hashed or Hashed()

    def read(n: int) -> bytes:
        data = f.read(n)
        seen.sha256.update(data)
        return data

    f.seek(0)
    try:
        return decompress(read, kind, cap)
    finally:
        while read(CHUNK):
            pass

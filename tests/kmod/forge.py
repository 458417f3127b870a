"""Byte-level surgery on signed modules, for building the inputs the kernel must refuse.

A signed module is ``payload || PKCS#7 blob || 12-byte module_signature || marker``; these
helpers take it apart and put it back together with one thing changed.
"""

from __future__ import annotations

import gzip
import lzma
import struct
from dataclasses import dataclass, replace

import zstandard

MARKER = b"~Module signature appended~\n"
INFO = struct.Struct(">BBBBB3sI")
RSA_ENCRYPTION = bytes.fromhex("06092a864886f70d010101")
SHA256_WITH_RSA = bytes.fromhex("06092a864886f70d01010b")


@dataclass(frozen=True)
class Signed:
    """A signed module split into its parts; ``info`` fields as in ``struct module_signature``."""

    payload: bytes
    blob: bytes
    algo: int = 0
    hash: int = 0
    id_type: int = 2
    signer_len: int = 0
    key_id_len: int = 0
    pad: bytes = b"\0\0\0"
    sig_len: int | None = None  # None: the blob's real length

    def to_bytes(self) -> bytes:
        """Reassemble, with whatever fields were changed."""
        sig_len = len(self.blob) if self.sig_len is None else self.sig_len
        info = INFO.pack(
            self.algo, self.hash, self.id_type, self.signer_len, self.key_id_len, self.pad, sig_len
        )
        return self.payload + self.blob + info + MARKER

    def with_(self, **changes: object) -> bytes:
        """The module with ``changes`` applied to its parts (see the field names)."""
        return replace(self, **changes).to_bytes()  # type: ignore[arg-type]


def split(data: bytes) -> Signed:
    """Take a well-formed signed module apart."""
    if not data.endswith(MARKER):
        raise ValueError("not a signed module")
    fields = INFO.unpack(data[-len(MARKER) - INFO.size : -len(MARKER)])
    sig_len = fields[-1]
    end = len(data) - len(MARKER) - INFO.size
    return Signed(data[: end - sig_len], data[end - sig_len : end], *fields[:-1])


def append_signature(payload: bytes, blob: bytes) -> bytes:
    """``payload`` signed with the detached PKCS#7 ``blob``, as sign-file lays it out."""
    return Signed(payload, blob).to_bytes()


def flip_bit(data: bytes, offset: int, bit: int = 0) -> bytes:
    """``data`` with one bit flipped at ``offset`` (negative offsets count from the end)."""
    out = bytearray(data)
    out[offset] ^= 1 << bit
    return bytes(out)


def graft(donor: bytes, onto: bytes) -> bytes:
    """``onto``'s payload carrying ``donor``'s signature trailer."""
    return Signed(split(onto).payload, split(donor).blob).to_bytes()


def rsa_oid_as_sha256_with_rsa(data: bytes) -> bytes:
    """Replace the SignerInfo's rsaEncryption OID by sha256WithRSAEncryption (same length)."""
    parts = split(data)
    if parts.blob.count(RSA_ENCRYPTION) != 1:
        raise ValueError("expected exactly one rsaEncryption OID in the blob")
    return replace(parts, blob=parts.blob.replace(RSA_ENCRYPTION, SHA256_WITH_RSA)).to_bytes()


def compress(data: bytes, kind: str) -> bytes:
    """Compress as kbuild's modules_install does (``xz``, ``zst`` or ``gz``)."""
    if kind == "xz":
        filters = [{"id": lzma.FILTER_LZMA2, "dict_size": 1 << 20}]
        return lzma.compress(data, check=lzma.CHECK_CRC32, filters=filters)
    if kind == "zst":
        return zstandard.ZstdCompressor().compress(data)
    if kind == "gz":
        return gzip.compress(data, mtime=0)
    raise ValueError(kind)

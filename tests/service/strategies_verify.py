"""Hypothesis strategies for the verification parsers: trailers, DER, mutated files."""

from __future__ import annotations

import struct

from hypothesis import strategies as st

MARKER = b"~Module signature appended~\n"
INFO = struct.Struct(">BBBBB3sI")

_byte = st.integers(0, 255)
_small = st.sampled_from([0, 0, 0, 1, 2, 255])


@st.composite
def trailers(draw: st.DrawFn) -> tuple[bytes, int]:
    """(last <= 40 bytes of a file, file length): plausible trailers, nearly-right, or noise."""
    if draw(st.booleans()):
        tail = draw(st.binary(max_size=40))
        return tail, draw(st.integers(len(tail), 1 << 40))
    info = INFO.pack(
        draw(_small),
        draw(_small),
        draw(st.sampled_from([2, 2, 2, 0, 1, 3, 255])),
        draw(_small),
        draw(_small),
        draw(st.sampled_from([b"\0\0\0", b"\0\0\1", b"\xff\0\0"])),
        draw(st.one_of(st.integers(0, 1 << 16), st.integers(0, (1 << 32) - 1))),
    )
    marker = draw(st.sampled_from([MARKER, MARKER[:-1] + b"\r", MARKER[1:]]))
    tail = (info + marker)[-draw(st.integers(0, 40)) :] if draw(st.booleans()) else info + marker
    return tail, draw(st.integers(len(tail), 1 << 33))


def _tlv(tag: int, body: bytes) -> bytes:
    n = len(body)
    length = (
        bytes([n]) if n < 0x80 else bytes([0x81, n]) if n < 256 else b"\x82" + n.to_bytes(2, "big")
    )
    return bytes([tag]) + length + body


_leaf = st.one_of(
    st.builds(lambda b: _tlv(0x02, b), st.binary(min_size=1, max_size=9)),  # INTEGER
    st.builds(lambda b: _tlv(0x06, b), st.binary(max_size=12)),  # OID
    st.builds(lambda b: _tlv(0x04, b), st.binary(max_size=40)),  # OCTET STRING
    st.just(b"\x05\x00"),  # NULL
    st.sampled_from(
        [
            bytes.fromhex("06092a864886f70d010702"),  # signedData
            bytes.fromhex("06092a864886f70d010701"),  # data
            bytes.fromhex("0609608648016503040201"),  # sha256
            bytes.fromhex("06092a864886f70d010101"),  # rsaEncryption
            bytes.fromhex("06082a8648ce3d040303"),  # ecdsa-with-SHA384
        ]
    ),
)

der = st.recursive(
    _leaf,
    lambda inner: st.builds(
        lambda tag, parts: _tlv(tag, b"".join(parts)),
        st.sampled_from([0x30, 0x31, 0xA0, 0xA1, 0x80]),
        st.lists(inner, max_size=5),
    ),
    max_leaves=30,
)
"""Random DER trees made of the tags and OIDs a PKCS#7 signature uses."""


@st.composite
def mutated(draw: st.DrawFn, base: bytes, hot: tuple[int, int] | None = None) -> bytes:
    """``base`` with a few bit flips, overwrites, cuts or insertions (biased to ``hot``)."""
    data = bytearray(base)
    for _ in range(draw(st.integers(1, 4))):
        if not data:
            break
        lo, hi = hot if hot and draw(st.booleans()) else (0, len(data))
        at = draw(st.integers(min(lo, len(data) - 1), min(hi, len(data)) - 1))
        op = draw(st.sampled_from(["flip", "set", "cut", "insert", "truncate"]))
        if op == "flip":
            data[at] ^= 1 << draw(st.integers(0, 7))
        elif op == "set":
            data[at] = draw(st.sampled_from([0, 0xFF, 0x7F, 0x80, draw(_byte)]))
        elif op == "cut":
            del data[at : at + draw(st.integers(1, 16))]
        elif op == "insert":
            data[at:at] = draw(st.binary(min_size=1, max_size=8))
        else:
            del data[at:]
    return bytes(data)

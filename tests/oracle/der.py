"""A tiny DER/BER writer with control over every length field (for deliberately odd encodings).

seq(oid("1.2.840.113549.1.7.1"))                 # minimal DER
tlv(0x30, body, octets=3)                        # long-form length on 3 octets
tlv(0x30, body, indefinite=True)                 # BER indefinite length + end-of-contents
"""

from __future__ import annotations

from service.verify.signature.oids import encode


def length(n: int, octets: int | None = None) -> bytes:
    """The length field for `n`; `octets` forces the long form on that many octets."""
    if octets is None:
        if n < 0x80:
            return bytes([n])
        octets = (n.bit_length() + 7) // 8
    return bytes([0x80 | octets]) + n.to_bytes(octets, "big")


def tlv(tag: int, content: bytes, *, octets: int | None = None, indefinite: bool = False) -> bytes:
    """One element; `indefinite` (constructed tags only) ends it with 00 00."""
    if indefinite:
        return bytes([tag, 0x80]) + content + b"\0\0"
    return bytes([tag]) + length(len(content), octets) + content


def seq(*parts: bytes) -> bytes:
    """SEQUENCE of the already encoded `parts`."""
    return tlv(0x30, b"".join(parts))


def set_of(*parts: bytes) -> bytes:
    """SET OF the already encoded `parts`, in the given order."""
    return tlv(0x31, b"".join(parts))


def integer(value: int) -> bytes:
    """INTEGER (two's complement, minimal)."""
    size = max(1, (value.bit_length() + 8) // 8)
    return tlv(0x02, value.to_bytes(size, "big", signed=True))


def oid(dotted: str) -> bytes:
    """OBJECT IDENTIFIER from its dotted form."""
    return tlv(0x06, encode(dotted))


def octets(data: bytes) -> bytes:
    """OCTET STRING."""
    return tlv(0x04, data)


def null() -> bytes:
    """NULL."""
    return b"\x05\x00"


def explicit(number: int, content: bytes) -> bytes:
    """[number] EXPLICIT (context-specific, constructed)."""
    return tlv(0xA0 | number, content)


def read_tlv(data: bytes, at: int = 0) -> tuple[int, int, int]:
    """(tag, content offset, content length) of the definite-length element at `at`."""
    tag, first = data[at], data[at + 1]
    if first < 0x80:
        return tag, at + 2, first
    count = first & 0x7F
    return tag, at + 2 + count, int.from_bytes(data[at + 2 : at + 2 + count], "big")


def children(data: bytes) -> list[bytes]:
    """The encoded elements inside a constructed element's content `data`."""
    out, at = [], 0
    while at < len(data):
        _, start, size = read_tlv(data, at)
        out.append(data[at : start + size])
        at = start + size
    return out


def reencode(element: bytes, *, octets: int | None = None, indefinite: bool = False) -> bytes:
    """`element` with its own length field re-encoded (the content is kept as is)."""
    tag, start, size = read_tlv(element)
    return tlv(tag, element[start : start + size], octets=octets, indefinite=indefinite)

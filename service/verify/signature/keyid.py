"""A signer's kernel key id in words: the issuer's name and the serial, when it has them.

For a SignerInfo v1 the kernel's key id is the raw serial INTEGER content octets
followed by the raw issuer Name content octets (docs/kernel.md, "The PKCS#7 message");
for v3 it is the subjectKeyIdentifier. :func:`describe_key_id` recovers the issuer and serial
from the first form so that an admin reads ``issuer "CN=…" serial 0x…`` instead of
hex, and falls back to ``key id <hex>`` (an SKID, or anything it cannot split).
"""

from __future__ import annotations

from asn1crypto import x509

MAX_SERIAL = 21  # RFC 5280: at most 20 octets, one more for a sign byte


def _sequence(content: bytes) -> bytes:
    """DER SEQUENCE header + ``content``."""
    n = len(content)
    if n < 0x80:
        return b"\x30" + bytes([n]) + content
    size = n.to_bytes((n.bit_length() + 7) // 8, "big")
    return b"\x30" + bytes([0x80 | len(size)]) + size + content


def split_key_id(key_id: bytes) -> tuple[int, str] | None:
    """(serial, issuer) if ``key_id`` is serial octets followed by an issuer Name."""
    for cut in range(1, min(len(key_id) - 1, MAX_SERIAL) + 1):
        issuer = key_id[cut:]
        if issuer[:1] != b"\x31":  # a Name's content is a run of RDN SETs
            continue
        try:
            name = x509.Name.load(_sequence(issuer), strict=True)
            parts = [
                f"{attr['type'].native}={attr['value'].native}"
                for rdn in name.chosen
                for attr in rdn
            ]
        except (ValueError, TypeError, KeyError):
            continue
        if parts:
            return int.from_bytes(key_id[:cut], "big", signed=True), ", ".join(parts)
    return None


def describe_key_id(key_id_hex: str | None) -> str:
    """``issuer "common_name=…" serial 0x…`` or ``key id <hex>`` ('-' when unknown)."""
    if not key_id_hex:
        return "-"
    try:
        raw = bytes.fromhex(key_id_hex)
    except ValueError:
        return f"key id {key_id_hex}"
    found = split_key_id(raw)
    if found is None:
        return f"key id {key_id_hex}"
    serial, issuer = found
    return f'issuer "{issuer}" serial {serial:#x}'

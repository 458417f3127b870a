"""A signer's kernel key id in words: the issuer's name and the serial, when it has them.

For a SignerInfo v1 the kernel's key id is the raw serial INTEGER content octets
followed by the raw issuer Name content octets (as crypto/asymmetric_keys/pkcs7_parser.c
and x509_cert_parser.c build it with ``asymmetric_key_generate_id``); for v3 it is the
subjectKeyIdentifier. :func:`describe_key_id` recovers the issuer and serial from the first
form, reading the name with the kernel's own grammar and rendering it as the kernel does
(:func:`~service.verify.signature.x509.issuer_name`), so that an admin reads
``issuer "Example GPU vendor: Signing key" serial 0x…`` instead of hex, and falls back to
``key id <hex>`` (an SKID, or anything it cannot split).
"""

from __future__ import annotations

from service.verify.signature.x509 import issuer_name

MAX_SERIAL = 21  # RFC 5280: at most 20 octets, one more for a sign byte


def split_key_id(key_id: bytes) -> tuple[int, str] | None:
    """(serial, issuer name) if ``key_id`` is serial octets followed by an issuer Name.

    The shortest serial whose remainder the kernel's grammar reads as a whole Name wins.
    """
    for cut in range(1, min(len(key_id) - 1, MAX_SERIAL) + 1):
        if key_id[cut : cut + 1] != b"\x31":  # a Name's content is a run of RDN SETs
            continue
        name = issuer_name(key_id[:cut], key_id[cut:])
        if name is not None:
            return int.from_bytes(key_id[:cut], "big", signed=True), name
    return None


def describe_key_id(key_id_hex: str | None) -> str:
    """``issuer "<name>" serial 0x…`` or ``key id <hex>`` ('-' when unknown)."""
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

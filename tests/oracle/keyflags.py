"""Certificates whose keyUsage and basicConstraints the kernels from 6.4 on read (the oracle's
key-flag cases, tests/vm/test_oracle.py; modstage's side is service/verify/signature/x509.py)."""

from __future__ import annotations

from cryptography import x509
from cryptography.x509.oid import ExtensionOID

_BITS = (
    "digital_signature", "content_commitment", "key_encipherment", "data_encipherment",
    "key_agreement", "key_cert_sign", "crl_sign",
)  # fmt: skip


def usage(*bits: str) -> x509.KeyUsage:
    """A keyUsage with exactly `bits` set (cryptography's argument names)."""
    return x509.KeyUsage(**{b: b in bits for b in _BITS}, encipher_only=False, decipher_only=False)


def _raw(oid: x509.ObjectIdentifier, value: bytes) -> x509.UnrecognizedExtension:
    return x509.UnrecognizedExtension(oid, value)


# Certificates for a key in no keyring (chain2048's), each with its extensions and whether
# the kernels from 6.4 on refuse it (x509_process_extension; 6.1 reads neither extension)
KEY_FLAG_CERTS: dict[str, tuple[list[x509.ExtensionType], bool]] = {
    # a BIT STRING with 8 unused bits
    "bad-key-usage": ([_raw(ExtensionOID.KEY_USAGE, b"\x03\x02\x08\x80")], True),
    # valid DER (03 01 00), but the kernel wants a content byte after the unused-bit count
    "key-usage-without-bits": ([usage()], True),
    # the SEQUENCE's length octet says 5, 3 bytes follow
    "bad-basic-constraints": (
        [_raw(ExtensionOID.BASIC_CONSTRAINTS, b"\x30\x05\x01\x01\xff")],
        True,
    ),
    "ca-without-digital-signature": (
        [x509.BasicConstraints(ca=True, path_length=None), usage("key_cert_sign")],
        False,
    ),
    "leaf-key-encipherment-only": (
        [x509.BasicConstraints(ca=False, path_length=None), usage("key_encipherment")],
        False,
    ),
}

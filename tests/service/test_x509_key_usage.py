"""keyUsage and basicConstraints as each target kernel's X.509 parser reads them (6.4 on)."""

from __future__ import annotations

import datetime
import errno

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtensionOID, NameOID

from service.verify.signature.asn1 import Asn1Error
from service.verify.signature.trust import TrustStore
from service.verify.signature.x509 import parse_certificate
from service.verify.targetkernel.rules import KernelRules

_KEY = ec.generate_private_key(ec.SECP256R1())
OLD, NEW = (6, 1), (6, 12)
# keyUsage as a BIT STRING claiming 8 unused bits; basicConstraints whose SEQUENCE length
# octet says 5 where 3 bytes follow: both refused by x509_process_extension from 6.4 on
BAD_KEY_USAGE = b"\x03\x02\x08\x80"
BAD_BASIC_CONSTRAINTS = b"\x30\x05\x01\x01\xff"
NO_BITS = b"\x03\x01\x00"  # valid DER for a keyUsage with no bit set, too short for 6.4


def self_signed(serial: int, *extensions: x509.ExtensionType) -> bytes:
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, f"key usage {serial}")])
    builder = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(_KEY.public_key())
        .serial_number(serial)
        .not_valid_before(datetime.datetime(2020, 1, 1, tzinfo=datetime.UTC))
        .not_valid_after(datetime.datetime(2120, 1, 1, tzinfo=datetime.UTC))
    )
    for extension in extensions:
        builder = builder.add_extension(extension, critical=False)
    return builder.sign(_KEY, hashes.SHA256()).public_bytes(serialization.Encoding.DER)


def _usage(*, digital_signature: bool, key_cert_sign: bool) -> x509.KeyUsage:
    return x509.KeyUsage(
        digital_signature=digital_signature,
        content_commitment=False,
        key_encipherment=False,
        data_encipherment=False,
        key_agreement=False,
        key_cert_sign=key_cert_sign,
        crl_sign=False,
        encipher_only=False,
        decipher_only=False,
    )


def _parse(der: bytes, version: tuple[int, int]) -> object:
    return parse_certificate(der, rules=KernelRules.parser(version, frozenset(), ecdsa=True))


@pytest.mark.parametrize(
    ("oid", "value"),
    [
        (ExtensionOID.KEY_USAGE, BAD_KEY_USAGE),
        (ExtensionOID.KEY_USAGE, NO_BITS),
        (ExtensionOID.BASIC_CONSTRAINTS, BAD_BASIC_CONSTRAINTS),
    ],
    ids=["keyUsage", "keyUsage-without-bits", "basicConstraints"],
)
def test_a_malformed_extension_fails_the_parse_from_6_4_on(
    oid: x509.ObjectIdentifier, value: bytes
) -> None:
    """6.1 skips keyUsage and basicConstraints; 6.4 and later refuse a malformed one with
    EBADMSG, so that certificate never enters the target's keyring."""
    der = self_signed(10, x509.UnrecognizedExtension(oid, value))
    _parse(der, OLD)
    for version in ((6, 4), NEW, (7, 2)):
        with pytest.raises(Asn1Error) as refused:
            _parse(der, version)
        assert refused.value.code == errno.EBADMSG


def test_the_key_flags_are_read_from_6_4_on() -> None:
    """A CA certificate with keyCertSign and no digitalSignature gets KEY_EFLAG_CA and
    KEY_EFLAG_KEYCERTSIGN on 6.12 (none on 6.1); a leaf's digitalSignature its own flag."""
    ca = self_signed(
        11,
        x509.BasicConstraints(ca=True, path_length=None),
        _usage(digital_signature=False, key_cert_sign=True),
    )
    leaf = self_signed(
        12,
        x509.BasicConstraints(ca=False, path_length=None),
        _usage(digital_signature=True, key_cert_sign=False),
    )
    flags = lambda c: (c.ca, c.digital_signature, c.key_cert_sign)  # noqa: E731
    assert flags(_parse(ca, NEW)) == (True, False, True)
    assert flags(_parse(leaf, NEW)) == (False, True, False)
    assert flags(_parse(ca, OLD)) == (False, False, False)


def test_a_malformed_extension_leaves_the_certificate_out_of_a_6_4_keyring() -> None:
    """The trusted directory's certificate with a malformed keyUsage counts for a 6.1
    target and not for a 6.12 one (named among the certificates it cannot load); a CA
    certificate without digitalSignature counts for both, as the kernel's module signature
    check reads no key flag."""
    bad = self_signed(13, x509.UnrecognizedExtension(ExtensionOID.KEY_USAGE, BAD_KEY_USAGE))
    ca = self_signed(
        14,
        x509.BasicConstraints(ca=True, path_length=None),
        _usage(digital_signature=False, key_cert_sign=True),
    )
    store = TrustStore.from_der(bad, ca)
    hashes_ = frozenset({"sha256"})
    old, old_dropped = store.kernel_keys(KernelRules.parser(OLD, hashes_, ecdsa=True))
    new, new_dropped = store.kernel_keys(KernelRules.parser(NEW, hashes_, ecdsa=True))
    assert len(old.keys) == 2 and not old_dropped
    assert [k.source for k in new.keys] == ["<certificate 1>"]
    assert len(new_dropped) == 1 and "malformed keyUsage" in new_dropped[0]

"""Trusted certificates read without libraries are filed exactly as the libraries file them."""

from __future__ import annotations

import datetime
import functools

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa
from cryptography.x509.name import _ASN1Type
from cryptography.x509.oid import NameOID
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from service.errors import TrustError
from service.verify.certinfo import NotPlain, plain_fields
from service.verify.trust import TrustedKey

TEXT = st.text(st.characters(min_codepoint=32, max_codepoint=0x2FF), min_size=1, max_size=20)
STRING_TYPES = st.sampled_from(
    [_ASN1Type.UTF8String, _ASN1Type.PrintableString, _ASN1Type.IA5String, _ASN1Type.BMPString]
)


@functools.cache
def rsa_key(bits: int) -> rsa.RSAPrivateKey:
    """One RSA key per size."""
    return rsa.generate_private_key(public_exponent=65537, key_size=bits)


@functools.cache
def ec_key() -> ec.EllipticCurvePrivateKey:
    """One P-256 key."""
    return ec.generate_private_key(ec.SECP256R1())


@st.composite
def certificates(draw: st.DrawFn) -> bytes:
    """DER certificates of many shapes: names, string types, serials, SKIDs, key types."""
    key: rsa.RSAPrivateKey | ec.EllipticCurvePrivateKey = (
        ec_key() if draw(st.booleans()) and draw(st.booleans()) else rsa_key(2048)
    )
    attrs = []
    for oid in draw(st.lists(st.sampled_from([NameOID.COMMON_NAME, NameOID.ORGANIZATION_NAME]))):
        value, kind = draw(TEXT), draw(STRING_TYPES)
        if kind in (_ASN1Type.PrintableString, _ASN1Type.IA5String):
            value = "".join(c for c in value if c.isascii() and (c.isalnum() or c in " .-")) or "x"
        attrs.append(x509.NameAttribute(oid, value, kind))
    subject = x509.Name(attrs)
    issuer = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, draw(TEXT))])
    now = datetime.datetime(2030, 1, 1, tzinfo=datetime.UTC)
    builder = (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(issuer)
        .public_key(key.public_key())
        .serial_number(draw(st.integers(1, (1 << 159) - 1)))
        .not_valid_before(now)
        .not_valid_after(now + datetime.timedelta(days=draw(st.integers(1, 40000))))
    )
    if draw(st.booleans()):
        skid = draw(st.binary(min_size=1, max_size=40))
        builder = builder.add_extension(x509.SubjectKeyIdentifier(skid), critical=False)
    if draw(st.booleans()):
        builder = builder.add_extension(x509.BasicConstraints(True, None), critical=True)
    cert = builder.sign(rsa_key(1024), hashes.SHA256())
    return cert.public_bytes(serialization.Encoding.DER)


def self_signed(
    key: rsa.RSAPrivateKey | ec.EllipticCurvePrivateKey,
    common_name: str,
    *,
    serial: int = 1,
    skid: bool = False,
) -> bytes:
    """A self-signed DER certificate of ``key`` named ``common_name``, valid one day from 2030."""
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])
    now = datetime.datetime(2030, 1, 1, tzinfo=datetime.UTC)
    builder = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(serial)
        .not_valid_before(now)
        .not_valid_after(now + datetime.timedelta(days=1))
    )
    if skid:
        ski = x509.SubjectKeyIdentifier.from_public_key(key.public_key())
        builder = builder.add_extension(ski, critical=False)
    return builder.sign(key, hashes.SHA256()).public_bytes(serialization.Encoding.DER)


def by_libraries(der: bytes) -> TrustedKey | str:
    """What asn1crypto and cryptography make of ``der`` (or their refusal's message)."""
    try:
        return TrustedKey._from_der_by_libraries(der, "c")
    except TrustError as exc:
        return exc.reason


def by_store(der: bytes) -> TrustedKey | str:
    """What the trust store makes of ``der`` (or its refusal's message)."""
    try:
        return TrustedKey.from_der(der, "c")
    except TrustError as exc:
        return exc.reason


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(certificates())
def test_plain_certificates_are_filed_as_the_libraries_file_them(der: bytes) -> None:
    """Same key ids and subject whether or not the certificate took the library-free path."""
    assert by_store(der) == by_libraries(der)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(certificates(), st.integers(0, 1 << 16), st.integers(0, 255))
def test_damaged_certificates_are_judged_as_the_libraries_judge_them(
    der: bytes, where: int, byte: int
) -> None:
    """One changed byte: accepted with the same fields, or refused for the same reason."""
    damaged = bytearray(der)
    damaged[where % len(der)] = byte
    assert by_store(bytes(damaged)) == by_libraries(bytes(damaged))


def test_a_sign_file_style_rsa_certificate_is_plain() -> None:
    """The common case (RSA, UTF8String commonName, SKID) takes the library-free path."""
    key = rsa_key(2048)
    der = self_signed(key, "Build time autogenerated key", serial=0x1234, skid=True)
    fields = plain_fields(der)
    assert fields.common_name == "Build time autogenerated key" and fields.serial == b"\x12\x34"
    assert TrustedKey.from_der(der, "c").public_key.key_size == 2048


def test_an_ec_certificate_is_not_plain() -> None:
    """Another key type goes to the libraries."""
    der = self_signed(ec_key(), "ec")
    with pytest.raises(NotPlain):
        plain_fields(der)
    assert TrustedKey.from_der(der, "c").subject == "ec"


def test_a_certificate_with_an_unknown_key_type_is_a_trust_error() -> None:
    """An unknown key algorithm is an unusable certificate, not a crash of the service."""
    der = self_signed(rsa_key(2048), "odd")
    odd = der.replace(bytes.fromhex("2a864886f70d010101"), bytes.fromhex("2a864886f70d0101ff"), 1)
    with pytest.raises(TrustError, match=r"not a usable X\.509 certificate"):
        TrustedKey.from_der(odd, "odd.der")

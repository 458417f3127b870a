"""An untrusted signer is named by issuer and serial, not raw hex.

The name is the one the kernel gives the issuer (``x509_fabricate_name``): the CN, the O or
the email address, or "O: CN", read with the kernel's own grammar.
"""

from __future__ import annotations

import datetime
import io
from pathlib import Path

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.hazmat.primitives.serialization import Encoding
from cryptography.x509.oid import NameOID

from service.cli import main
from service.verify.signature.keyid import (
    UNNAMED,
    SignerId,
    cert_serial,
    describe_key_id,
    distinguished_name,
    matches,
    name_certificate,
    name_signature,
    split_key_id,
)
from service.verify.signature.x509 import Cert, parse_certificate
from service.verify.targetkernel.rules import KernelRules
from tests.kmod import SigningKey, sign


def test_verify_names_an_untrusted_signer_by_issuer_and_serial(
    tmp_path: Path,
    modules: dict[str, Path],
    other_key: SigningKey,
    rsa_key: SigningKey,
    kernel: str,
) -> None:
    """``verify`` prints the untrusted issuer's name, as the kernel renders it, and serial
    (issuer+serial signer)."""
    trusted = tmp_path / "trusted.d"
    trusted.mkdir()
    (trusted / "rsa.pem").write_bytes(rsa_key.cert_pem.read_bytes())
    module = sign(modules["ms_params"], other_key, tmp_path / "m.ko")
    out = io.StringIO()
    assert main(["verify", "--trusted", str(trusted), "--kernel", kernel, str(module)], out) == 1
    line = out.getvalue()
    assert 'signer=issuer "untrusted" serial 0x' in line, line


def test_a_key_id_that_is_no_issuer_and_serial_stays_hex() -> None:
    """An SKID (or anything else) is shown as 'key id <hex>'."""
    assert split_key_id(bytes(range(20))) is None
    assert describe_key_id("00" * 20) == "key id " + "00" * 20
    assert describe_key_id(None) == "-"


def self_signed(
    *attributes: tuple[x509.ObjectIdentifier, str], serial: int = 0x1234, skid: bool = False
) -> bytes:
    """A self-signed P-256 certificate whose subject and issuer are ``attributes`` (with a
    subjectKeyIdentifier extension if ``skid``)."""
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(oid, value) for oid, value in attributes])
    now = datetime.datetime(2025, 1, 1, tzinfo=datetime.UTC)
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
        ext = x509.SubjectKeyIdentifier.from_public_key(key.public_key())
        builder = builder.add_extension(ext, critical=False)
    return builder.sign(key, hashes.SHA256()).public_bytes(Encoding.DER)


CN, ORG, EMAIL = NameOID.COMMON_NAME, NameOID.ORGANIZATION_NAME, NameOID.EMAIL_ADDRESS
C, OU = NameOID.COUNTRY_NAME, NameOID.ORGANIZATIONAL_UNIT_NAME


@pytest.mark.parametrize(
    ("attributes", "rendered"),
    [
        (((CN, "Signing key"),), "Signing key"),
        (((ORG, "Example GPU vendor"),), "Example GPU vendor"),
        (((EMAIL, "keys@example.com"),), "keys@example.com"),
        (((C, "DE"), (OU, "Drivers")), ""),
        (((ORG, "Example GPU vendor"), (CN, "Signing key")), "Example GPU vendor: Signing key"),
        (((ORG, "Example GPU vendor"), (CN, "Example GPU vendor key")), "Example GPU vendor key"),
        (((ORG, "Example Corp"), (CN, "Example GPU key")), "Example GPU key"),
        (((CN, "first"), (EMAIL, "keys@example.com"), (CN, "last")), "last"),
    ],
    ids=["cn", "o", "email", "none", "o-cn", "cn-begins-with-o", "first-7-shared", "last-cn"],
)
def test_names_are_rendered_as_the_kernel_renders_them(
    attributes: tuple[tuple[x509.ObjectIdentifier, str], ...], rendered: str
) -> None:
    """The issuer of a key id reads as x509_fabricate_name renders it, the same name the
    certificate parser gives its subject: the CN, else the O, else the email, else empty;
    "O: CN" unless the CN begins with the O or they share 7 leading bytes; the last of a kind."""
    der = self_signed(*attributes, serial=0x1234)
    cert = parse_certificate(
        der, rules=KernelRules.parser((6, 1), frozenset({"sha256"}), ecdsa=True)
    )
    assert cert.subject == rendered
    assert split_key_id(cert.id) == (0x1234, rendered)
    assert describe_key_id(cert.id.hex()) == f'issuer "{rendered}" serial 0x1234'


def test_a_serial_that_looks_like_a_set_is_kept_whole() -> None:
    """A serial whose bytes begin like an RDN SET does not swallow the issuer: the kernel's
    grammar reads the remainder as a whole Name only at the real boundary."""
    der = self_signed((CN, "Signing key"), serial=0x0131_0506)
    cert = parse_certificate(
        der, rules=KernelRules.parser((6, 1), frozenset({"sha256"}), ecdsa=True)
    )
    assert split_key_id(cert.id) == (0x0131_0506, "Signing key")


def test_a_name_with_trailing_bytes_stays_hex() -> None:
    """An issuer that is a Name followed by stray bytes is not a Name: the key id stays hex."""
    der = self_signed((CN, "Signing key"))
    cert = parse_certificate(
        der, rules=KernelRules.parser((6, 1), frozenset({"sha256"}), ecdsa=True)
    )
    assert split_key_id(cert.id + b"\x05\x00") is None


def _parse(der: bytes) -> Cert:
    """The certificate as 6.12's parser reads it."""
    return parse_certificate(
        der, rules=KernelRules.parser((6, 12), frozenset({"sha256"}), ecdsa=True)
    )


VENDOR = ((ORG, "Example GPU vendor"), (CN, "Signing key"))


def test_a_certificate_with_an_skid_is_named_by_its_subject_and_skid() -> None:
    """As x509_key_preparse describes a key: "<subject>: <SKID hex>" when the certificate
    has a subjectKeyIdentifier (its raw octets, as cryptography computes them), whatever its
    serial; both of the kernel's ids (serial || issuer, SKID) find it."""
    der = self_signed(*VENDOR, serial=0x7AEAC1F5, skid=True)
    skid = x509.load_der_x509_certificate(der).extensions.get_extension_for_class(
        x509.SubjectKeyIdentifier
    )
    cert = _parse(der)
    name = name_certificate(cert, "trusted.d/vendor.pem")
    assert name.name == f"Example GPU vendor: Signing key: {skid.value.digest.hex()}"
    assert (name.serial, name.skid) == ("7aeac1f5", skid.value.digest.hex())
    assert name.source == "trusted.d/vendor.pem"
    assert matches(cert, SignerId(cert.id)) and matches(cert, SignerId(skid.value.digest))


def test_a_certificate_without_skid_is_named_by_its_subject_and_serial_with_its_sign_byte() -> None:
    """Without an SKID the description ends in the serial INTEGER's content octets, in
    lower-case hex: a serial whose top bit is set keeps its leading 00 (the kernel's
    raw_serial), so 0x80ab is "0080ab"."""
    cert = _parse(self_signed(*VENDOR, serial=0x80AB))
    assert cert.skid is None and cert_serial(cert) == b"\x00\x80\xab"
    name = name_certificate(cert, "x")
    assert (name.name, name.serial, name.skid) == (
        "Example GPU vendor: Signing key: 0080ab",
        "0080ab",
        None,
    )


def test_a_signature_alone_names_issuer_and_serial_or_only_the_skid() -> None:
    """Issuer+serial: "<issuer's name>: <serial>" (what the kernel shows for that certificate
    if it has no SKID) with the whole issuer; an SKID carries no name: UNNAMED and the SKID."""
    cert = _parse(self_signed(*VENDOR, serial=0x7AEAC1F52E49F8F1))
    by_serial = name_signature(SignerId(cert.id, cert_serial(cert), cert.raw_issuer))
    assert by_serial.name == "Example GPU vendor: Signing key: 7aeac1f52e49f8f1"
    assert by_serial.issuer == "CN=Signing key,O=Example GPU vendor" and by_serial.source is None
    by_skid = name_signature(SignerId(b"\x01\x02", skid=b"\x01\x02"))
    assert (by_skid.name, by_skid.skid, by_skid.issuer) == (f"{UNNAMED}: 0102", "0102", None)


@pytest.mark.parametrize(
    "attributes",
    [
        ((C, "US"), (ORG, "Example GPU vendor"), (CN, "Signing key")),
        ((CN, "a, b+c; <d> \\ e"), (EMAIL, "keys@example.com")),
        ((CN, " #leading and trailing "),),
    ],
    ids=["plain", "specials", "spaces"],
)
def test_the_whole_issuer_is_written_as_rfc4514_as_cryptography_writes_it(
    attributes: tuple[tuple[x509.ObjectIdentifier, str], ...],
) -> None:
    """The issuer shown on request is RFC 4514, last RDN first, escaped, equal to
    cryptography's ``rfc4514_string`` of the same name."""
    der = self_signed(*attributes)
    cert = _parse(der)
    want = x509.load_der_x509_certificate(der).issuer.rfc4514_string()
    assert distinguished_name(cert.raw_issuer) == want

"""Loading trusted certificates and finding them by the kernel's key ids."""

from __future__ import annotations

import datetime
from pathlib import Path

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec

from service.errors import TrustError
from service.verify.signature.pkcs7 import parse_message
from service.verify.signature.trust import TrustStore
from service.verify.targetkernel.kernel import Target
from service.verify.targetkernel.rules import KernelRules
from service.verify.verdict import verify_path
from tests.kmod import SigningKey, make_key, sign, split


def key_ids(cert_der: bytes) -> tuple[bytes, bytes]:
    """(serial||issuer, SKID) computed from cryptography's view of the certificate."""
    cert = x509.load_der_x509_certificate(cert_der)
    n = cert.serial_number
    issuer = cert.issuer.public_bytes()
    header = 2 + (issuer[1] & 0x7F if issuer[1] & 0x80 else 0)
    skid = cert.extensions.get_extension_for_class(x509.SubjectKeyIdentifier).value.digest
    return n.to_bytes((n.bit_length() + 8) // 8, "big") + issuer[header:], skid


def test_pem_bundle_and_concatenated_der_load_every_certificate(tmp_path: Path) -> None:
    """One PEM file with two certificates and one DER file with two: four keys, eight ids."""
    keys = [make_key(tmp_path / "k", "p256", cn=f"k{i}") for i in range(4)]
    store = tmp_path / "trusted.d"
    store.mkdir()
    (store / "bundle.pem").write_bytes(
        keys[0].cert_pem.read_bytes() + keys[1].cert_pem.read_bytes()
    )
    (store / "pair.der").write_bytes(keys[2].cert_der.read_bytes() + keys[3].cert_der.read_bytes())
    (store / "README.txt").write_text("not a certificate, ignored by suffix")
    trust = TrustStore.from_directory(store)
    assert sorted(k.subject for k in trust.keys) == ["k0", "k1", "k2", "k3"]
    for key in keys:
        serial_issuer, skid = key_ids(key.cert_der.read_bytes())
        found = trust.find(serial_issuer)
        assert found is not None and found is trust.find(skid)


def test_key_ids_match_what_sign_file_writes(signed_rsa: Path, rsa_key: SigningKey) -> None:
    """The id the store files a certificate under is the id in sign-file's SignerInfo."""
    trust = TrustStore.from_der(rsa_key.cert_der.read_bytes())
    message = parse_message(
        split(signed_rsa.read_bytes()).blob,
        rules=KernelRules.parser((6, 1), frozenset({"sha256"}), ecdsa=False),
    )
    found = trust.find(message.signers[0].auth_id)
    assert found is not None and found.subject == "modstage rsa"


def test_same_issuer_and_serial_twice_is_a_configuration_error(tmp_path: Path) -> None:
    """Two certificates the kernel could not tell apart are refused, naming both files."""
    a = make_key(tmp_path / "a", "p256", cn="twin", serial=4242)
    b = make_key(tmp_path / "b", "p256", cn="twin", serial=4242)
    store = tmp_path / "trusted.d"
    store.mkdir()
    (store / "a.der").write_bytes(a.cert_der.read_bytes())
    (store / "b.crt").write_bytes(b.cert_pem.read_bytes())
    with pytest.raises(TrustError, match="also filed by") as exc:
        TrustStore.from_directory(store, strict=True)
    assert "a.der" in str(exc.value) and "b.crt" in str(exc.value)


@pytest.mark.parametrize(
    ("name", "content", "expected"),
    [
        (
            "junk.pem",
            b"-----BEGIN CERTIFICATE-----\nnot base64!\n-----END CERTIFICATE-----\n",
            "base64",
        ),
        ("empty.pem", b"-----BEGIN PUBLIC KEY-----\n", "without a CERTIFICATE"),
        ("junk.der", b"\x04\x03abc", "no DER certificate"),
        ("short.der", b"\x30\x82\x05\x00\x01", "truncated"),
        ("empty.der", b"", "empty certificate file"),
        ("notx509.der", b"\x30\x03\x02\x01\x01", "not a usable X.509 certificate"),
    ],
)
def test_unusable_files_are_trust_errors(
    tmp_path: Path, name: str, content: bytes, expected: str
) -> None:
    """Checked strictly, a broken file in the trust directory is an error naming the file."""
    (tmp_path / name).write_bytes(content)
    with pytest.raises(TrustError, match=expected) as exc:
        TrustStore.from_directory(tmp_path, strict=True)
    assert exc.value.path.endswith(name)


def test_a_certificate_with_an_unknown_key_type_is_a_trust_error(rsa_key: SigningKey) -> None:
    """An unknown key algorithm is an unusable certificate, not a crash of the service."""
    der = rsa_key.cert_der.read_bytes()
    rsa_oid = bytes.fromhex("2a864886f70d010101")
    assert rsa_oid in der
    odd = der.replace(rsa_oid, bytes.fromhex("2a864886f70d0101ff"), 1)
    with pytest.raises(TrustError, match=r"not a usable X\.509 certificate"):
        TrustStore.from_der(odd)


def test_missing_directory_is_a_trust_error(tmp_path: Path) -> None:
    """A trust directory that does not exist is reported, not treated as empty."""
    with pytest.raises(TrustError, match="cannot list"):
        TrustStore.from_directory(tmp_path / "absent")


def test_symlinked_certificate_is_followed(tmp_path: Path, rsa_key: SigningKey) -> None:
    """The directory is admin-owned: a symlink to a certificate elsewhere is honoured."""
    (tmp_path / "link.pem").symlink_to(rsa_key.cert_pem)
    assert [k.subject for k in TrustStore.from_directory(tmp_path).keys] == ["modstage rsa"]


def expired_certificate(key: SigningKey) -> bytes:
    """A self-signed certificate for ``key`` (an EC key) whose validity ended in 2001."""
    private = serialization.load_pem_private_key(key.key.read_bytes(), None)
    assert isinstance(private, ec.EllipticCurvePrivateKey)
    name = x509.Name([x509.NameAttribute(x509.NameOID.COMMON_NAME, "expired")])
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(private.public_key())
        .serial_number(77)
        .not_valid_before(datetime.datetime(2000, 1, 1, tzinfo=datetime.UTC))
        .not_valid_after(datetime.datetime(2001, 1, 1, tzinfo=datetime.UTC))
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(private.public_key()), False)
        .sign(private, hashes.SHA256())
    )
    return cert.public_bytes(serialization.Encoding.DER)


def test_expired_certificate_still_verifies(
    tmp_path: Path, modules: dict[str, Path], kernel: str, target: Target
) -> None:
    """Date policy: the kernel ignores validity dates for module signatures; so does modstage."""
    key = make_key(tmp_path, "p256", cn="fresh")
    key.cert_der.write_bytes(expired_certificate(key))
    expired = SigningKey(key.key, key.cert_der, key.cert_der, key.kind)  # sign-file reads DER too
    signed = sign(modules["ms_exporter"], expired, tmp_path / "m.ko")
    trust = TrustStore.from_der(key.cert_der.read_bytes())
    verdict = verify_path(signed, trust=trust, kernel=target)
    assert verdict.ok, verdict.reason
    assert verdict.signer == "expired"

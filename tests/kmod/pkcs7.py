"""Build module signatures that sign-file never makes: several signers, embedded certificates
and CRLs, chains, odd key sizes, BER encodings. For the verification tests and the oracle.

Keys and certificates come from ``cryptography``; the PKCS#7 structure from ``asn1crypto``
(detached, no signed attributes, as the kernel wants for modules), so each case changes
exactly one thing against a kernel-acceptable baseline.
"""

from __future__ import annotations

import datetime
import hashlib
from dataclasses import dataclass

from asn1crypto import algos, cms, core
from asn1crypto import x509 as asn1_x509
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, padding, rsa
from cryptography.x509.oid import NameOID

_HASHES = {"sha256": hashes.SHA256, "sha384": hashes.SHA384, "sha512": hashes.SHA512}
_T0 = datetime.datetime(2024, 1, 1, tzinfo=datetime.UTC)


@dataclass(frozen=True)
class Cert:
    """A private key and its certificate (DER)."""

    key: rsa.RSAPrivateKey | ec.EllipticCurvePrivateKey
    der: bytes

    @property
    def parsed(self) -> asn1_x509.Certificate:
        """asn1crypto's view of the certificate."""
        return asn1_x509.Certificate.load(self.der)


def make_cert(
    cn: str,
    *,
    bits: int = 2048,
    curve: ec.EllipticCurve | None = None,
    issuer: Cert | None = None,
    ca: bool = False,
    serial: int = 1000,
) -> Cert:
    """A certificate for a new RSA (``bits``) or EC (``curve``) key, self-signed or by ``issuer``."""
    key: rsa.RSAPrivateKey | ec.EllipticCurvePrivateKey = (
        ec.generate_private_key(curve) if curve else rsa.generate_private_key(65537, bits)
    )
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, cn)])
    signer_key = issuer.key if issuer else key
    issuer_name = x509.load_der_x509_certificate(issuer.der).subject if issuer else name
    builder = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(issuer_name)
        .public_key(key.public_key())
        .serial_number(serial)
        .not_valid_before(_T0)
        .not_valid_after(_T0 + datetime.timedelta(days=3650))
        .add_extension(x509.BasicConstraints(ca=ca, path_length=None), critical=True)
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), False)
        .add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_public_key(signer_key.public_key()), False
        )
    )
    cert = builder.sign(signer_key, hashes.SHA256())
    return Cert(key, cert.public_bytes(serialization.Encoding.DER))


def _raw_signature(
    key: rsa.RSAPrivateKey | ec.EllipticCurvePrivateKey, payload: bytes, hash: str
) -> bytes:
    algorithm = _HASHES[hash]()
    if isinstance(key, rsa.RSAPrivateKey):
        return key.sign(payload, padding.PKCS1v15(), algorithm)
    return key.sign(payload, ec.ECDSA(algorithm))


def signer_info(
    payload: bytes, signer: Cert, *, hash: str = "sha256", skid: bool = False
) -> cms.SignerInfo:
    """A SignerInfo over ``payload`` (no signed attributes), by issuer+serial or SKID."""
    tbs = signer.parsed["tbs_certificate"]
    if skid:
        sid = cms.SignerIdentifier(
            name="subject_key_identifier", value=signer.parsed.key_identifier_value
        )
    else:
        sid = cms.SignerIdentifier(
            name="issuer_and_serial_number",
            value=cms.IssuerAndSerialNumber(
                {"issuer": tbs["issuer"], "serial_number": tbs["serial_number"]}
            ),
        )
    is_rsa = isinstance(signer.key, rsa.RSAPrivateKey)
    sig_alg = "rsassa_pkcs1v15" if is_rsa else f"{hash}_ecdsa"
    return cms.SignerInfo(
        {
            "version": "v3" if skid else "v1",
            "sid": sid,
            "digest_algorithm": algos.DigestAlgorithm({"algorithm": hash}),
            "signature_algorithm": algos.SignedDigestAlgorithm({"algorithm": sig_alg}),
            "signature": _raw_signature(signer.key, payload, hash),
        }
    )


def signed_data(
    signers: list[cms.SignerInfo],
    *,
    certs: tuple[bytes, ...] = (),
    crls: tuple[bytes, ...] = (),
    version: str | None = None,
) -> bytes:
    """A ContentInfo(signedData) DER with ``signers``, embedded ``certs`` and ``crls``."""
    skid = any(s["version"].native == "v3" for s in signers)
    content: dict[str, object] = {
        "version": version or ("v3" if skid else "v1"),
        "digest_algorithms": [s["digest_algorithm"] for s in signers],
        "encap_content_info": {"content_type": "data"},
        "signer_infos": signers,
    }
    if certs:
        content["certificates"] = [asn1_x509.Certificate.load(c) for c in certs]
    if crls:
        content["crls"] = [core.Any.load(c) for c in crls]
    return cms.ContentInfo(
        {"content_type": "signed_data", "content": cms.SignedData(content)}
    ).dump()


def tlv(tag: int, body: bytes) -> bytes:
    """One DER element (definite length)."""
    n = len(body)
    if n < 0x80:
        return bytes([tag, n]) + body
    size = (n.bit_length() + 7) // 8
    return bytes([tag, 0x80 | size]) + n.to_bytes(size, "big") + body


def digest(payload: bytes, hash: str = "sha256") -> bytes:
    """The digest the kernel computes over the signed bytes."""
    return hashlib.new(hash, payload).digest()


def _element(der: bytes, at: int) -> tuple[int, int, int]:
    """(tag, content start, end) of the definite-length DER element at ``at``."""
    tag, first = der[at], der[at + 1]
    if first < 0x80:
        return tag, at + 2, at + 2 + first
    size = first & 0x7F
    length = int.from_bytes(der[at + 2 : at + 2 + size], "big")
    return tag, at + 2 + size, at + 2 + size + length


def indefinite_around(der: bytes, inner: bytes) -> bytes:
    """``der`` with the element equal to ``inner``, and every element holding it, re-encoded
    with indefinite lengths (BER), which the kernel's decoder accepts for constructed types."""

    def walk(at: int) -> bytes:
        tag, start, end = _element(der, at)
        whole = der[at:end]
        if inner not in whole or not tag & 0x20:
            return whole
        children, pos = b"", start
        while pos < end:
            children += walk(pos)
            pos = _element(der, pos)[2]
        return bytes([tag, 0x80]) + children + b"\0\0"

    return walk(0)

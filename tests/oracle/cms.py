"""A PKCS#7 SignedData builder for module signatures, with a knob for every field the kernel reads.

Signatures are real (cryptography, `Prehashed`, deterministic ECDSA), so a case differs from a
sign-file signature only in what its spec changes. Defaults reproduce sign-file's output:
SignedData v1, issuer+serial, digest parameters absent, detached `data`, no certificates,
no attributes, rsaEncryption / ecdsa-with-<digest>.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field

from asn1crypto import x509 as asn1_x509
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.asymmetric import ec, padding, utils

from tests.oracle import der
from tests.oracle.pki import Cred

DATA = "1.2.840.113549.1.7.1"
SIGNED_DATA = "1.2.840.113549.1.7.2"
ATTR_CONTENT_TYPE = "1.2.840.113549.1.9.3"
ATTR_MESSAGE_DIGEST = "1.2.840.113549.1.9.4"
ATTR_SIGNING_TIME = "1.2.840.113549.1.9.5"
ATTR_SMIME_CAPS = "1.2.840.113549.1.9.15"
DIGESTS: dict[str, tuple[str, hashes.HashAlgorithm]] = {
    "md5": ("1.2.840.113549.2.5", hashes.MD5()),
    "sha1": ("1.3.14.3.2.26", hashes.SHA1()),
    "sha224": ("2.16.840.1.101.3.4.2.4", hashes.SHA224()),
    "sha256": ("2.16.840.1.101.3.4.2.1", hashes.SHA256()),
    "sha384": ("2.16.840.1.101.3.4.2.2", hashes.SHA384()),
    "sha512": ("2.16.840.1.101.3.4.2.3", hashes.SHA512()),
    "sha3-256": ("2.16.840.1.101.3.4.2.8", hashes.SHA3_256()),
    "sha3-384": ("2.16.840.1.101.3.4.2.9", hashes.SHA3_384()),
    "sha3-512": ("2.16.840.1.101.3.4.2.10", hashes.SHA3_512()),
}
SIG_ALGS = {
    "rsaEncryption": "1.2.840.113549.1.1.1",
    "sha256WithRSAEncryption": "1.2.840.113549.1.1.11",
    "rsassa-pss": "1.2.840.113549.1.1.10",
    "rsa-with-sha3-256": "2.16.840.1.101.3.4.3.14",
    "ecdsa-with-SHA1": "1.2.840.10045.4.1",
    "ecdsa-with-sha1": "1.2.840.10045.4.1",
    "ecdsa-with-sha224": "1.2.840.10045.4.3.1",
    "ecdsa-with-sha256": "1.2.840.10045.4.3.2",
    "ecdsa-with-sha384": "1.2.840.10045.4.3.3",
    "ecdsa-with-sha512": "1.2.840.10045.4.3.4",
    "ecdsa-with-sha3-256": "2.16.840.1.101.3.4.3.10",
    "ecdsa-with-sha3-384": "2.16.840.1.101.3.4.3.11",
    "ecdsa-with-sha3-512": "2.16.840.1.101.3.4.3.12",
}


@dataclass(frozen=True)
class Signer:
    """One SignerInfo. `cert` names the signer (default: `key`'s own certificate)."""

    key: Cred
    cert: Cred | None = None
    digest: str = "sha256"
    sid: str = "issuer"  # issuer | skid
    version: int | None = None  # default: 1 for issuer, 3 for skid
    sig_alg: str | None = None  # default: rsaEncryption / ecdsa-with-<digest>
    digest_params_null: bool = False
    attrs: tuple[bytes, ...] | None = None  # encoded Attributes; () = automatic pair
    unsigned_attrs: bytes | None = None
    bad_signature: bool = False  # sign other bytes than the module
    ber_signature: bool = False  # ECDSA (r, s) with non-minimal lengths
    issuer_indefinite: bool = False
    issuer_octets: int | None = None  # long-form length on the issuer Name
    sid_raw: bytes | None = None  # an encoded sid used as is
    digest_params: bytes | None = None  # encoded parameters of the digest AlgorithmIdentifier
    signature_pad: bytes = b""  # bytes put before the signature value


@dataclass(frozen=True)
class Cms:
    """A SignedData; `signers_tag` 0x30 encodes SignerInfos as a SEQUENCE."""

    signers: tuple[Signer, ...]
    certs: tuple[bytes, ...] = ()
    crls: tuple[bytes, ...] = ()
    sd_version: int | None = None
    outer_oid: str = SIGNED_DATA
    content_oid: str = DATA
    attached: bytes | None = None
    digest_algorithms: tuple[str, ...] | None = None
    signers_tag: int = 0x31
    outer_octets: int | None = None
    extra: bytes = b""  # bytes after the ContentInfo (inside sig_len)
    field_order_swap: bool = False  # certificates after the SignerInfos (not allowed)
    sd_extra: bytes = b""  # encoded elements after the SignerInfos, inside SignedData
    no_content: bool = False  # ContentInfo without its [0] content
    meta: dict[str, str] = field(default_factory=dict)


def alg_id(dotted: str, params_null: bool = False) -> bytes:
    """AlgorithmIdentifier with parameters absent (or NULL)."""
    return der.seq(der.oid(dotted), der.null() if params_null else b"")


def cert_parts(cert_der: bytes) -> tuple[bytes, int, bytes]:
    """(raw issuer Name, serial, subjectKeyIdentifier) of a certificate."""
    cert = asn1_x509.Certificate.load(cert_der)
    tbs = cert["tbs_certificate"]
    return tbs["issuer"].dump(), int(tbs["serial_number"].native), cert.key_identifier or b""


def _sid(signer: Signer) -> bytes:
    if signer.sid_raw is not None:
        return signer.sid_raw
    issuer, serial, skid = cert_parts((signer.cert or signer.key).der)
    if signer.sid == "skid":
        return der.tlv(0x80, skid)
    if signer.issuer_indefinite or signer.issuer_octets:
        issuer = der.reencode(
            issuer, indefinite=signer.issuer_indefinite, octets=signer.issuer_octets
        )
    return der.seq(issuer, der.integer(serial))


def _ber(sig: bytes) -> bytes:
    """Re-encode a DER ECDSA (r, s) with two-octet long-form lengths (valid BER, not DER)."""
    _, start, size = der.read_tlv(sig)
    r, s = der.children(sig[start : start + size])
    return der.tlv(0x30, der.reencode(r, octets=2) + der.reencode(s, octets=2), octets=2)


def _sign(signer: Signer, message_digest: bytes) -> bytes:
    _, algorithm = DIGESTS[signer.digest]
    key = signer.key.key
    if isinstance(key, ec.EllipticCurvePrivateKey):
        sig = key.sign(
            message_digest, ec.ECDSA(utils.Prehashed(algorithm), deterministic_signing=True)
        )
        return _ber(sig) if signer.ber_signature else sig
    return key.sign(message_digest, padding.PKCS1v15(), utils.Prehashed(algorithm))


def _hash(name: str, data: bytes) -> bytes:
    return hashlib.new(name.replace("-", "_"), data).digest()


def signer_info(signer: Signer, content: bytes) -> bytes:
    """The encoded SignerInfo over `content`."""
    digest_oid, _ = DIGESTS[signer.digest]
    content_digest = _hash(signer.digest, content + (b"x" if signer.bad_signature else b""))
    version = signer.version or (3 if signer.sid == "skid" else 1)
    sig_alg = signer.sig_alg or (
        f"ecdsa-with-{signer.digest}" if signer.key.is_ec else "rsaEncryption"
    )
    signed_attrs, to_sign = b"", content_digest
    if signer.attrs is not None:
        attrs = signer.attrs or (
            der.seq(der.oid(ATTR_CONTENT_TYPE), der.set_of(der.oid(DATA))),
            der.seq(der.oid(ATTR_MESSAGE_DIGEST), der.set_of(der.octets(content_digest))),
        )
        body = b"".join(attrs)
        signed_attrs = der.tlv(0xA0, body)
        to_sign = _hash(signer.digest, der.tlv(0x31, body))
    parts = [
        der.integer(version),
        _sid(signer),
        der.seq(der.oid(digest_oid), signer.digest_params)
        if signer.digest_params is not None
        else alg_id(digest_oid, signer.digest_params_null),
        signed_attrs,
        alg_id(SIG_ALGS[sig_alg], params_null=not sig_alg.startswith("ecdsa")),
        der.octets(signer.signature_pad + _sign(signer, to_sign)),
    ]
    if signer.unsigned_attrs is not None:
        parts.append(der.tlv(0xA1, signer.unsigned_attrs))
    return der.seq(*parts)


def build(cms: Cms, content: bytes) -> bytes:
    """The DER (or deliberately BER/broken) ContentInfo for `cms` signing `content`."""
    versions = {s.version or (3 if s.sid == "skid" else 1) for s in cms.signers}
    sd_version = cms.sd_version or (3 if 3 in versions else 1)
    digests = cms.digest_algorithms or tuple(dict.fromkeys(s.digest for s in cms.signers))
    digest_set = der.set_of(*(alg_id(DIGESTS[d][0]) for d in digests))
    encap = [der.oid(cms.content_oid)]
    if cms.attached is not None:
        encap.append(der.explicit(0, der.octets(cms.attached)))
    certs = der.tlv(0xA0, b"".join(cms.certs)) if cms.certs else b""
    crls = der.tlv(0xA1, b"".join(cms.crls)) if cms.crls else b""
    infos = der.tlv(cms.signers_tag, b"".join(signer_info(s, content) for s in cms.signers))
    middle = [certs, crls, infos] if not cms.field_order_swap else [infos, certs, crls]
    signed_data = der.seq(
        der.integer(sd_version), digest_set, der.seq(*encap), *middle, cms.sd_extra
    )
    body = der.oid(cms.outer_oid) + (b"" if cms.no_content else der.explicit(0, signed_data))
    return der.tlv(0x30, body, octets=cms.outer_octets) + cms.extra

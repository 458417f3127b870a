"""``pkcs7_parse_message`` (crypto/asymmetric_keys/pkcs7_parser.c, Linux 6.1).

The kernel's PKCS#7 grammar runs through the port of its BER decoder
(:mod:`service.verify.signature.asn1`) with ports of its actions, so what parses, and the errno
of what does not, is the kernel's: ``EMSGSIZE`` over 65,535 bytes, ``EBADMSG`` for
malformed BER, ``EINVAL`` for a content type or version it does not take, ``ENOPKG``
for a digest or signature algorithm its parser does not know (before 6.7 no SHA-3 and no
ecdsa-with-SHA3; from 6.7 no MD4 or MD5; from 6.11 no SM2), and whatever an embedded
certificate's parse returns.
"""

from __future__ import annotations

import errno
from dataclasses import dataclass, field

from service.verify.signature.asn1 import Asn1Error, ber_decode
from service.verify.signature.asn1_machines import PKCS7_ACTIONS, PKCS7_MACHINE
from service.verify.signature.oids import decode, look_up
from service.verify.signature.x509 import Cert, parse_certificate
from service.verify.targetkernel.rules import KernelRules

_DIGESTS = {
    "md4": "md4",
    "md5": "md5",
    "sha1": "sha1",
    "sha256": "sha256",
    "sha384": "sha384",
    "sha512": "sha512",
    "sha224": "sha224",
    "sm3": "sm3",
    "gost2012Digest256": "streebog256",
    "gost2012Digest512": "streebog512",
}
_PKEYS = {
    "rsaEncryption": ("rsa", "pkcs1"),
    "id_ecdsa_with_sha1": ("ecdsa", "x962"),
    "id_ecdsa_with_sha224": ("ecdsa", "x962"),
    "id_ecdsa_with_sha256": ("ecdsa", "x962"),
    "id_ecdsa_with_sha384": ("ecdsa", "x962"),
    "id_ecdsa_with_sha512": ("ecdsa", "x962"),
    "SM2_with_SM3": ("sm2", "raw"),
    "gost2012PKey256": ("ecrdsa", "raw"),
    "gost2012PKey512": ("ecrdsa", "raw"),
}


# The PKCS#7 and X.509 parsers name ML-DSA from 7.0 (pkcs7_sig_note_pkey_algo: the ml_dsa
# row); whether the kernel verifies it is CONFIG_CRYPTO_MLDSA's question. modstage verifies
# no ML-DSA signature.
ML_DSA = {"id_ml_dsa_44": "ML-DSA-44", "id_ml_dsa_65": "ML-DSA-65", "id_ml_dsa_87": "ML-DSA-87"}


class MlDsaSignature(Asn1Error):
    """A signer using ML-DSA on a target whose parser names it (``KernelRules.ml_dsa``); the
    caller decides by the target's config whether its kernel could verify it."""

    def __init__(self, variant: str) -> None:
        super().__init__(errno.ENOPKG, f"{variant} signature")
        self.variant = variant


def digests(rules: KernelRules) -> dict[str, str]:
    """The digests ``pkcs7_sig_note_digest_algo`` of a kernel with ``rules`` names: MD4 and
    MD5 gone and SHA-3 added in 6.7 (the ``md4_md5`` and ``sha3`` rows)."""
    out = {k: v for k, v in _DIGESTS.items() if k not in ("md4", "md5") or rules.md4_md5}
    if rules.sha3:
        out.update({h: h for h in ("sha3_256", "sha3_384", "sha3_512")})
    return out


def pkeys(rules: KernelRules) -> dict[str, tuple[str, str]]:
    """The signature algorithms ``pkcs7_sig_note_pkey_algo`` of a kernel with ``rules``
    names: SM2 gone in 6.11, ECDSA with SHA-3 added in 6.7 (the ``sm2`` and ``sha3`` rows)."""
    out = {k: v for k, v in _PKEYS.items() if k != "SM2_with_SM3" or rules.sm2}
    if rules.sha3:
        out.update({f"id_ecdsa_with_sha3_{n}": ("ecdsa", "x962") for n in (256, 384, 512)})
    return out


_AUTHENTICODE = ("msSpOpusInfo", "msStatementType")


@dataclass
class SignerInfo:
    """One SignerInfo (``struct pkcs7_signed_info``)."""

    index: int
    auth_id: bytes  # the kernel's key id of the signer: serial || issuer, or the SKID
    skid_form: bool  # version 3: identified by subjectKeyIdentifier
    raw_serial: bytes = b""  # version 1: the serial INTEGER's content octets
    raw_issuer: bytes = b""  # version 1: the issuer Name's content octets
    hash_algo: str | None = None
    pkey_algo: str | None = None
    encoding: str | None = None
    pkey_oid: str | None = None
    signature: bytes = b""
    authattrs: bool = False
    signer: Cert | None = None
    unsupported_crypto: bool = False


@dataclass
class Message:
    """A parsed module signature (``struct pkcs7_message``)."""

    version: int = 0
    data_type: str | None = None
    has_data: bool = False
    have_authattrs: bool = False
    certs: list[Cert] = field(default_factory=list)
    signers: list[SignerInfo] = field(default_factory=list)


class _Ctx:
    """``struct pkcs7_parse_context`` and the actions that fill it."""

    def __init__(self, data: bytes, rules: KernelRules) -> None:
        self.data, self.rules = data, rules
        self.digests = digests(rules)
        self.pkeys = pkeys(rules)
        self.msg = Message()
        self.last_oid: str | None = None
        self.last_raw = b""
        self.pending: list[Cert] = []
        self.cert_index = 0
        self.expect_skid = False
        self.raw_serial = b""
        self.raw_issuer = b""
        self.raw_skid = b""
        self._new_sinfo()

    def _new_sinfo(self) -> None:
        self.sinfo = SignerInfo(0, b"", False)
        self.aa_set: set[str] = set()

    def value(self, at: int, n: int) -> bytes:
        return self.data[at : at + n]

    def pkcs7_note_OID(self, hdr: int, tag: int, at: int, n: int) -> None:
        self.last_raw = self.value(at, n)
        self.last_oid = look_up(self.last_raw)

    def pkcs7_check_content_type(self, hdr: int, tag: int, at: int, n: int) -> None:
        if self.last_oid != "signed_data":
            raise Asn1Error(errno.EINVAL, f"content type {decode(self.last_raw)} is not signedData")

    def pkcs7_note_signeddata_version(self, hdr: int, tag: int, at: int, n: int) -> None:
        value = self.value(at, n)
        if n != 1 or value[0] not in (1, 3):
            raise Asn1Error(errno.EINVAL, f"SignedData version {value.hex()} is not 1 or 3")
        self.msg.version = value[0]

    def pkcs7_note_signerinfo_version(self, hdr: int, tag: int, at: int, n: int) -> None:
        value = self.value(at, n)
        if n != 1 or value[0] not in (1, 3):
            raise Asn1Error(errno.EINVAL, f"SignerInfo version {value.hex()} is not 1 or 3")
        if (value[0] == 1) != (self.msg.version == 1):
            raise Asn1Error(errno.EBADMSG, "SignerInfo version does not match SignedData's")
        self.expect_skid = value[0] == 3

    def pkcs7_extract_cert(self, hdr: int, tag: int, at: int, n: int) -> None:
        if tag != 0x30:
            raise Asn1Error(errno.EBADMSG, f"certificate list entry with tag {tag:#x}")
        start, length = at - hdr, n + hdr
        if self.data[start + 1 : start + 2] == b"\x80":
            length += 2
        der = self.data[start : start + length]
        try:
            cert = parse_certificate(der, rules=self.rules)
        except Asn1Error as exc:
            raise Asn1Error(exc.code, f"embedded certificate: {exc.why}") from exc
        self.cert_index += 1
        cert.index = self.cert_index
        self.pending.append(cert)

    def pkcs7_note_certificate_list(self, hdr: int, tag: int, at: int, n: int) -> None:
        self.msg.certs = self.pending + self.msg.certs
        self.pending = []

    def pkcs7_note_content(self, hdr: int, tag: int, at: int, n: int) -> None:
        if self.last_oid not in ("data", "msIndirectData"):
            raise Asn1Error(errno.EINVAL, f"signed content type {decode(self.last_raw)}")
        self.msg.data_type = self.last_oid

    def pkcs7_note_data(self, hdr: int, tag: int, at: int, n: int) -> None:
        self.msg.has_data = True

    def pkcs7_sig_note_authenticated_attr(self, hdr: int, tag: int, at: int, n: int) -> None:
        oid = self.last_oid
        if oid in (
            "contentType",
            "signingTime",
            "messageDigest",
            "smimeCapabilites",
            *_AUTHENTICODE,
        ):
            if oid in self.aa_set:
                raise Asn1Error(errno.EKEYREJECTED, f"repeated signed attribute {oid}")
            self.aa_set.add(str(oid))
        if oid == "contentType" and look_up(self.value(at, n)) != self.msg.data_type:
            raise Asn1Error(errno.EBADMSG, "contentType attribute differs from the content")
        if oid == "messageDigest" and tag != 0x04:
            raise Asn1Error(errno.EBADMSG, "messageDigest attribute is not an OCTET STRING")
        if oid == "signingTime":
            from service.verify.signature.x509 import _decode_time

            _decode_time(tag, self.value(at, n))
        if oid in ("smimeCapabilites", *_AUTHENTICODE) and self.msg.data_type != "msIndirectData":
            raise Asn1Error(errno.EKEYREJECTED, f"signed attribute {oid} outside Authenticode")

    def pkcs7_sig_note_set_of_authattrs(self, hdr: int, tag: int, at: int, n: int) -> None:
        if not {"contentType", "messageDigest"} <= self.aa_set:
            raise Asn1Error(errno.EBADMSG, "signed attributes without contentType/messageDigest")
        if self.msg.data_type != "msIndirectData" and "msSpOpusInfo" in self.aa_set:
            raise Asn1Error(errno.EBADMSG, "Authenticode attribute in a non-Authenticode message")
        self.sinfo.authattrs = True

    def pkcs7_sig_note_serial(self, hdr: int, tag: int, at: int, n: int) -> None:
        self.raw_serial = self.value(at, n)

    def pkcs7_sig_note_issuer(self, hdr: int, tag: int, at: int, n: int) -> None:
        self.raw_issuer = self.value(at, n)

    def pkcs7_sig_note_skid(self, hdr: int, tag: int, at: int, n: int) -> None:
        self.raw_skid = self.value(at, n)

    def pkcs7_sig_note_digest_algo(self, hdr: int, tag: int, at: int, n: int) -> None:
        name = self.digests.get(self.last_oid or "")
        if name is None:
            raise Asn1Error(errno.ENOPKG, f"digest algorithm {decode(self.last_raw)}")
        self.sinfo.hash_algo = name

    def pkcs7_sig_note_pkey_algo(self, hdr: int, tag: int, at: int, n: int) -> None:
        if self.last_oid in ML_DSA and self.rules.ml_dsa:
            raise MlDsaSignature(ML_DSA[self.last_oid])
        found = self.pkeys.get(self.last_oid or "")
        if found is None:
            raise Asn1Error(errno.ENOPKG, f"signature algorithm {decode(self.last_raw)}")
        self.sinfo.pkey_algo, self.sinfo.encoding = found
        self.sinfo.pkey_oid = self.last_oid

    def pkcs7_sig_note_signature(self, hdr: int, tag: int, at: int, n: int) -> None:
        self.sinfo.signature = self.value(at, n)

    def pkcs7_note_signed_info(self, hdr: int, tag: int, at: int, n: int) -> None:
        sinfo = self.sinfo
        if self.msg.data_type == "msIndirectData" and not sinfo.authattrs:
            raise Asn1Error(errno.EBADMSG, "Authenticode SignerInfo without signed attributes")
        sinfo.skid_form = self.expect_skid
        sinfo.auth_id = self.raw_skid if self.expect_skid else self.raw_serial + self.raw_issuer
        if not self.expect_skid:
            sinfo.raw_serial, sinfo.raw_issuer = self.raw_serial, self.raw_issuer
        sinfo.index = len(self.msg.signers) + 1
        self.msg.signers.append(sinfo)
        self._new_sinfo()


def parse_message(blob: bytes, *, rules: KernelRules) -> Message:
    """Parse a module's PKCS#7 blob as the target kernel with ``rules`` does; raises
    :class:`Asn1Error` with its errno."""
    ctx = _Ctx(blob, rules)
    actions = [getattr(ctx, name) for name in PKCS7_ACTIONS]
    ber_decode(PKCS7_MACHINE, actions, blob)
    msg = ctx.msg
    if not msg.signers:
        raise Asn1Error(errno.EINVAL, "no SignerInfo (inconsistently supplied authAttrs)")
    want = msg.signers[0].authattrs
    if any(s.authattrs != want for s in msg.signers):
        raise Asn1Error(errno.EINVAL, "inconsistently supplied signed attributes")
    msg.have_authattrs = want
    return msg

"""``x509_cert_parse`` (crypto/asymmetric_keys/x509_cert_parser.c) for embedded certs.

A PKCS#7 message may carry certificates; the kernel parses every one with its own X.509
grammar and actions, and any failure fails the whole message; a trusted certificate the
target's parser refuses never enters its keyring. The actions follow the target's rules
(:class:`~service.verify.targetkernel.rules.KernelRules`: ``key_usage``, :func:`sig_algos`). The
key flags (``KEY_EFLAG_*``) are kept on :class:`Cert` but decide nothing here: the kernel's
module signature check (``pkcs7_validate_trust``, ``public_key_verify_signature``) reads
none of them, so a CA certificate or one without digitalSignature in the built-in or
secondary keyring still verifies a module; only keyring restrictions Debian does not build
(``CONFIG_INTEGRITY_CA_MACHINE_KEYRING``'s ``restrict_link_by_ca``) read them.

This module runs the same grammar (:mod:`service.verify.signature.asn1`) with ports of the
actions, then the parts of ``x509_get_sig_params`` and ``x509_check_for_self_signed`` that
decide acceptance.
"""

from __future__ import annotations

import errno
import hashlib
from dataclasses import dataclass, field

from service.verify.signature.asn1 import Asn1Error, ber_decode
from service.verify.signature.asn1_machines import (
    X509_ACTIONS,
    X509_AKID_ACTIONS,
    X509_AKID_MACHINE,
    X509_MACHINE,
)
from service.verify.signature.oids import look_up
from service.verify.signature.pubkey import PublicKey, SigParams, verify_signature
from service.verify.targetkernel.rules import KernelRules

_SIG_ALGOS = {
    "md4WithRSAEncryption": ("md4", "rsa", "pkcs1"),
    "sha1WithRSAEncryption": ("sha1", "rsa", "pkcs1"),
    "sha256WithRSAEncryption": ("sha256", "rsa", "pkcs1"),
    "sha384WithRSAEncryption": ("sha384", "rsa", "pkcs1"),
    "sha512WithRSAEncryption": ("sha512", "rsa", "pkcs1"),
    "sha224WithRSAEncryption": ("sha224", "rsa", "pkcs1"),
    "id_ecdsa_with_sha1": ("sha1", "ecdsa", "x962"),
    "id_ecdsa_with_sha224": ("sha224", "ecdsa", "x962"),
    "id_ecdsa_with_sha256": ("sha256", "ecdsa", "x962"),
    "id_ecdsa_with_sha384": ("sha384", "ecdsa", "x962"),
    "id_ecdsa_with_sha512": ("sha512", "ecdsa", "x962"),
    "gost2012Signature256": ("streebog256", "ecrdsa", "raw"),
    "gost2012Signature512": ("streebog512", "ecrdsa", "raw"),
    "SM2_with_SM3": ("sm3", "sm2", "raw"),
}
_EC_CURVES = {
    "sm2": "sm2",
    "id_prime192v1": "ecdsa-nist-p192",
    "id_prime256v1": "ecdsa-nist-p256",
    "id_ansip384r1": "ecdsa-nist-p384",
}
_SHA3 = ("sha3_256", "sha3_384", "sha3_512")


def sig_algos(rules: KernelRules) -> dict[str, tuple[str, str, str]]:
    """The certificate signature algorithms ``x509_note_sig_algo`` of a kernel with
    ``rules`` names (its ``md4_md5``, ``sm2`` and ``sha3`` rows)."""
    out = dict(_SIG_ALGOS)
    if not rules.md4_md5:
        del out["md4WithRSAEncryption"]
    if not rules.sm2:
        del out["SM2_with_SM3"]
    if rules.sha3:
        out.update({f"id_rsassa_pkcs1_v1_5_with_{h}": (h, "rsa", "pkcs1") for h in _SHA3})
        out.update({f"id_ecdsa_with_{h}": (h, "ecdsa", "x962") for h in _SHA3})
    return out


def ec_curves(rules: KernelRules) -> dict[str, str]:
    """The EC key parameters ``x509_extract_key_data`` of a kernel with ``rules`` takes."""
    return {k: v for k, v in _EC_CURVES.items() if k != "sm2" or rules.sm2}


@dataclass
class Cert:
    """One parsed certificate, with the fields the kernel's trust walk uses."""

    der: bytes
    index: int = 0
    id: bytes = b""  # serial || issuer
    skid: bytes | None = None
    auth_ids: list[bytes | None] = field(default_factory=lambda: [None, None])
    raw_subject: bytes = b""
    raw_issuer: bytes = b""
    subject: str = ""
    pub: PublicKey | None = None
    sig: SigParams | None = None
    self_signed: bool = False
    unsupported_sig: bool = False
    # the public key's KEY_EFLAG_CA, _DIGITALSIG, _KEYCERTSIGN (6.4 on, else all False)
    ca: bool = False
    digital_signature: bool = False
    key_cert_sign: bool = False
    signer: Cert | None = None  # set by the chain walk
    seen: bool = False
    verified: bool = False


class _Ctx:
    """The parse context of one certificate (``struct x509_parse_context``)."""

    def __init__(self, data: bytes, cert: Cert, rules: KernelRules) -> None:
        self.data, self.cert = data, cert
        self.sm2 = rules.sm2
        self.key_usage = rules.key_usage
        self.sig_algos = sig_algos(rules)
        self.ec_curves = ec_curves(rules)
        self.last_oid: str | None = None
        self.sig_algo: str | None = None
        self.names: dict[str, bytes] = {}
        self.key_algo: str | None = None
        self.key: bytes | None = None
        self.params: bytes | None = None
        self.raw_akid: bytes | None = None
        self.akid_issuer: bytes | None = None
        self.serial = b""
        self.tbs = b""
        self.raw_sig = b""
        self.hash: tuple[str, str, str] | None = None
        self.have_issuer = self.have_subject = False

    def value(self, at: int, n: int) -> bytes:
        return self.data[at : at + n]

    # the actions, by their C names
    def x509_note_OID(self, hdr: int, tag: int, at: int, n: int) -> None:
        self.last_oid = look_up(self.value(at, n))

    def x509_note_tbs_certificate(self, hdr: int, tag: int, at: int, n: int) -> None:
        self.tbs = self.data[at - hdr : at + n]

    def x509_note_sig_algo(self, hdr: int, tag: int, at: int, n: int) -> None:
        found = self.sig_algos.get(self.last_oid or "")
        if found is None:
            raise Asn1Error(errno.ENOPKG, f"certificate signature algorithm {self.last_oid}")
        self.hash, self.sig_algo = found, self.last_oid

    def x509_note_signature(self, hdr: int, tag: int, at: int, n: int) -> None:
        if self.last_oid != self.sig_algo:
            raise Asn1Error(errno.EINVAL, "certificate signature algorithms differ")
        value = self.value(at, n)
        if self.hash and self.hash[1] in ("rsa", "ecrdsa", "sm2", "ecdsa"):
            if not value or value[0] != 0:
                raise Asn1Error(errno.EBADMSG, "certificate signature BIT STRING")
            value = value[1:]
        self.raw_sig = value

    def x509_note_serial(self, hdr: int, tag: int, at: int, n: int) -> None:
        self.serial = self.value(at, n)

    def x509_extract_name_segment(self, hdr: int, tag: int, at: int, n: int) -> None:
        if self.last_oid in ("commonName", "organizationName", "email_address"):
            self.names[self.last_oid] = self.value(at, n)

    def _name(self) -> str:
        names, self.names = self.names, {}
        return fabricate_name(names)

    def x509_note_issuer(self, hdr: int, tag: int, at: int, n: int) -> None:
        if self.have_issuer:
            raise Asn1Error(errno.EINVAL, "second issuer name")
        self.have_issuer = True
        self.cert.raw_issuer = self.value(at, n)
        self._name()

    def x509_note_subject(self, hdr: int, tag: int, at: int, n: int) -> None:
        if self.have_subject:
            raise Asn1Error(errno.EINVAL, "second subject name")
        self.have_subject = True
        self.cert.raw_subject = self.value(at, n)
        self.cert.subject = self._name()

    def x509_note_params(self, hdr: int, tag: int, at: int, n: int) -> None:
        if not self.cert.raw_subject or self.key is not None:
            return
        self.params = self.data[at - hdr : at + n]

    def x509_extract_key_data(self, hdr: int, tag: int, at: int, n: int) -> None:
        self.key_algo = self.last_oid
        if self.last_oid == "rsaEncryption":
            algo = "rsa"
        elif self.last_oid in ("gost2012PKey256", "gost2012PKey512"):
            algo = "ecrdsa"
        elif self.last_oid == "sm2" and self.sm2:
            algo = "sm2"
        elif self.last_oid == "id_ecPublicKey":
            params = self.params or b""
            if len(params) < 2 or params[0] != 0x06 or params[1] != len(params) - 2:
                raise Asn1Error(errno.EBADMSG, "EC key parameters are not an OID")
            curve = self.ec_curves.get(look_up(params[2:]) or "")
            if curve is None:
                raise Asn1Error(errno.ENOPKG, "EC curve unknown to the kernel")
            algo = curve
        else:
            raise Asn1Error(errno.ENOPKG, f"public key algorithm {self.last_oid}")
        value = self.value(at, n)
        if not value or value[0] != 0:
            raise Asn1Error(errno.EBADMSG, "public key BIT STRING")
        self.key, self.cert.pub = value[1:], PublicKey(algo, value[1:])

    def x509_process_extension(self, hdr: int, tag: int, at: int, n: int) -> None:
        v = self.value(at, n)
        if self.last_oid == "subjectKeyIdentifier":
            if self.cert.skid is not None or n < 3 or v[0] != 0x04 or v[1] != n - 2:
                raise Asn1Error(errno.EBADMSG, "subjectKeyIdentifier extension")
            self.cert.skid = v[2:]
        elif self.last_oid == "authorityKeyIdentifier":
            self.raw_akid = v
        elif self.last_oid == "keyUsage" and self.key_usage:
            self._key_usage(v)
        elif self.last_oid == "basicConstraints" and self.key_usage:
            self._basic_constraints(v)

    def _key_usage(self, v: bytes) -> None:
        """``x509_process_extension``'s keyUsage (6.4 on): the value must be a BIT STRING
        of at least one content byte with fewer than 8 unused bits, else the certificate is
        refused (EBADMSG); digitalSignature is the first bit, keyCertSign the sixth (read
        only where the unused-bit count leaves it in the string)."""
        if not v or v[0] != 0x03 or len(v) < 4 or v[2] >= 8:
            raise Asn1Error(errno.EBADMSG, "malformed keyUsage extension")
        if v[3] & 0x80:
            self.cert.digital_signature = True
        one_byte = v[1] == 0x02 and v[2] <= 2
        if v[3] & 0x04 and (one_byte or (len(v) > 4 and v[1] == 0x03)):
            self.cert.key_cert_sign = True

    def _basic_constraints(self, v: bytes) -> None:
        """``x509_process_extension``'s basicConstraints (6.4 on): the value must be a
        SEQUENCE whose length octet is the rest of the value, else EBADMSG; cA is set by a
        first BOOLEAN whose content byte is 1."""
        if not v or v[0] != 0x30 or len(v) < 2 or v[1] != len(v) - 2:
            raise Asn1Error(errno.EBADMSG, "malformed basicConstraints extension")
        if len(v) >= 4 and v[1] != 0 and v[2] == 0x01 and v[3] == 1:
            self.cert.ca = True

    def x509_note_not_before(self, hdr: int, tag: int, at: int, n: int) -> None:
        _decode_time(tag, self.value(at, n))

    def x509_note_not_after(self, hdr: int, tag: int, at: int, n: int) -> None:
        _decode_time(tag, self.value(at, n))

    def x509_akid_note_kid(self, hdr: int, tag: int, at: int, n: int) -> None:
        if self.cert.auth_ids[1] is None:
            self.cert.auth_ids[1] = self.value(at, n)

    def x509_akid_note_name(self, hdr: int, tag: int, at: int, n: int) -> None:
        self.akid_issuer = self.value(at, n)

    def x509_akid_note_serial(self, hdr: int, tag: int, at: int, n: int) -> None:
        if self.akid_issuer is None or self.cert.auth_ids[0] is not None:
            return
        self.cert.auth_ids[0] = self.value(at, n) + self.akid_issuer


def fabricate_name(names: dict[str, bytes]) -> str:
    """``x509_fabricate_name``: the name the kernel gives a certificate's subject or issuer.

    ``names`` holds the last commonName, organizationName and email_address value of the
    Name (``x509_extract_name_segment``). The CN, else the O, else the email, else an empty
    name; with both CN and O it is ``"O: CN"`` unless the CN begins with the O or both share
    their first 7 bytes. The kernel copies the bytes as they are; here they are read as UTF-8.
    """
    cn, o = names.get("commonName"), names.get("organizationName")
    chosen = cn or o or names.get("email_address") or b""
    if cn and o and not (cn.startswith(o) or (cn[:7] == o[:7] and len(o) >= 7)):
        chosen = o + b": " + cn
    return chosen.decode("utf-8", "replace")


def _tlv(tag: int, content: bytes) -> bytes:
    """DER tag, length and ``content`` (definite length, as the decoder reads it)."""
    n = len(content)
    if n < 0x80:
        return bytes([tag, n]) + content
    size = n.to_bytes((n.bit_length() + 7) // 8, "big")
    return bytes([tag, 0x80 | len(size)]) + size + content


def issuer_name(serial: bytes, issuer: bytes) -> str | None:
    """The issuer's name as the kernel renders it (:func:`fabricate_name`), or None.

    ``serial`` and ``issuer`` are an INTEGER's and a Name's content octets (the two halves of
    the key id ``serial || issuer`` the kernel gives an X.509 certificate). They are read as
    the kernel reads them in an authorityKeyIdentifier (authorityCertIssuer's directoryName
    and authorityCertSerialNumber): with its x509_akid grammar, whose Name is x509.asn1's
    with the same actions. None when that grammar refuses them, as it refuses a Name that is
    not a whole run of non-empty RDN SETs.
    """
    akid = _tlv(0x30, _tlv(0xA1, _tlv(0xA4, _tlv(0x30, issuer))) + _tlv(0x82, serial))
    cert = Cert(b"")
    ctx = _Ctx(akid, cert, KernelRules.oldest())
    try:
        ber_decode(X509_AKID_MACHINE, _actions(ctx, X509_AKID_ACTIONS), akid)  # type: ignore[arg-type]
    except Asn1Error:
        return None
    if cert.auth_ids[0] != serial + issuer:  # x509_akid_note_serial's key id
        return None
    return fabricate_name(ctx.names)


def _decode_time(tag: int, value: bytes) -> None:
    """``x509_decode_time``: only the checks that can fail (every digit is a digit)."""
    if tag == 23 and len(value) == 13:
        digits = value[:12]
    elif tag == 24 and len(value) == 15:
        digits = value[:14]
    else:
        raise Asn1Error(errno.EBADMSG, "unsupported certificate time")
    if not all(0x30 <= b <= 0x39 for b in digits):
        raise Asn1Error(errno.EBADMSG, "invalid certificate time (not a digit)")
    if tag == 23:
        year = int(digits[:2])
        year += 1900 if year >= 50 else 2000
        rest = digits[2:]
    else:
        year = int(digits[:4])
        if 1950 <= year <= 2049:
            raise Asn1Error(errno.EBADMSG, "GeneralizedTime year that UTCTime must carry")
        rest = digits[4:]
    if value[-1:] != b"Z":
        raise Asn1Error(errno.EBADMSG, "unsupported certificate time (no Z)")
    mon, day, hour, minute, sec = (int(rest[i : i + 2]) for i in range(0, 10, 2))
    if year < 1970 or not 1 <= mon <= 12:
        raise Asn1Error(errno.EBADMSG, "invalid certificate time")
    days = [31, 28, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31]
    limit = days[mon - 1]
    if mon == 2 and year % 4 == 0 and (year % 100 != 0 or year % 400 == 0):
        limit = 29
    if not 1 <= day <= limit or hour > 24 or minute > 59 or sec > 60:
        raise Asn1Error(errno.EBADMSG, "invalid certificate time")


def _actions(ctx: _Ctx, names: tuple[str, ...]) -> list[object]:
    return [getattr(ctx, name) for name in names]


def parse_certificate(der: bytes, *, rules: KernelRules) -> Cert:
    """``x509_cert_parse`` of one embedded certificate; raises :class:`Asn1Error`.

    ``rules`` are the target kernel's: the digests it can compute (a certificate signed
    with another is kept, unverified, as the kernel keeps it), whether it has ECDSA, and
    the algorithms and extensions its parser knows (:func:`sig_algos`, :func:`ec_curves`).
    """
    cert = Cert(der)
    ctx = _Ctx(der, cert, rules)
    ber_decode(X509_MACHINE, _actions(ctx, X509_ACTIONS), der)  # type: ignore[arg-type]
    if ctx.raw_akid is not None:
        akid = _Ctx(ctx.raw_akid, cert, rules)
        ber_decode(X509_AKID_MACHINE, _actions(akid, X509_AKID_ACTIONS), ctx.raw_akid)  # type: ignore[arg-type]
    cert.id = ctx.serial + cert.raw_issuer
    hash_algo, pkey_algo, encoding = ctx.hash or ("", "", "")
    digest = b""
    if hash_algo in rules.hashes and hash_algo in hashlib.algorithms_available:
        digest = hashlib.new(hash_algo, ctx.tbs).digest()
    else:
        cert.unsupported_sig = True
    cert.sig = SigParams(pkey_algo, encoding, hash_algo, ctx.raw_sig, digest)
    _check_self_signed(cert, rules.ecdsa)
    return cert


def _check_self_signed(cert: Cert, have_ecdsa: bool) -> None:
    if cert.raw_subject != cert.raw_issuer:
        return
    kid0, kid1 = cert.auth_ids
    if kid0 is not None or kid1 is not None:
        a = kid1 is not None and cert.skid == kid1
        b = kid0 is not None and cert.id == kid0
        if not a and not b:
            return
        if a != b and kid0 is not None and kid1 is not None:
            raise Asn1Error(errno.EKEYREJECTED, "self-signed certificate with mismatched AKID")
    if cert.unsupported_sig or cert.pub is None or cert.sig is None:
        return
    code = verify_signature(cert.pub, cert.sig, have_ecdsa=have_ecdsa)
    if code == errno.ENOPKG:
        cert.unsupported_sig = True
    elif code:
        raise Asn1Error(code, f"self-signed certificate {cert.subject!r} does not verify")
    else:
        cert.self_signed = True

"""A signer's kernel key id in words: the kernel's name for the key, the issuer and serial.

For a SignerInfo v1 the kernel's key id is the raw serial INTEGER content octets
followed by the raw issuer Name content octets (as crypto/asymmetric_keys/pkcs7_parser.c
and x509_cert_parser.c build it with ``asymmetric_key_generate_id``); for v3 it is the
subjectKeyIdentifier. :func:`describe_key_id` recovers the issuer and serial from the first
form, reading the name with the kernel's own grammar and rendering it as the kernel does
(:func:`~service.verify.signature.x509.issuer_name`), so that an admin reads
``issuer "Example GPU vendor: Signing key" serial 0x…`` instead of hex, and falls back to
``key id <hex>`` (an SKID, or anything it cannot split).

``status`` names a signer as the kernel names its key (:class:`SignerName`, below): from the
certificate when one is known, else from the signature's own identifier (:class:`SignerId`),
with the whole issuer name (:func:`distinguished_name`) beside it.
"""

from __future__ import annotations

from dataclasses import dataclass

from service.verify.signature.oids import decode
from service.verify.signature.x509 import Cert, issuer_name

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


# --- A signer as the kernel names its key -----------------------------------------------
#
# ``x509_key_preparse`` (crypto/asymmetric_keys/x509_public_key.c, 6.1 and 6.12) describes a
# certificate's key as "<subject>: <hex>": the subject as ``x509_fabricate_name`` makes it
# (CN, O or email, or "O: CN") and the subjectKeyIdentifier's octets in lower-case hex, or the
# serial INTEGER's content octets when the certificate has no SKID. That description is what
# /proc/keys and keyctl show and what boot logs as "Loaded X.509 cert '<description>'".

#: A signer named by its SKID only (SignerInfo v3): the signature carries no name.
UNNAMED = "(unknown subject)"


@dataclass(frozen=True)
class SignerId:
    """How a module signature's first SignerInfo names its key: by issuer and serial
    (version 1, ``serial``/``issuer``) or by subjectKeyIdentifier (version 3, ``skid``)."""

    key_id: bytes  # the id the kernel searches its keyrings for ("ex:<hex>")
    serial: bytes | None = None  # the serial INTEGER's content octets
    issuer: bytes | None = None  # the issuer Name's content octets
    skid: bytes | None = None


@dataclass(frozen=True)
class SignerName:
    """A signing key as people and the kernel name it.

    ``name`` is the kernel's description of the key ("Example GPU vendor: 7aeac1f5…");
    ``issuer`` the whole issuer name (RFC 4514), ``serial`` and ``skid`` in hex where known;
    ``source`` says where the name comes from: a certificate's path, ``kernel keyring``, or
    None when only the signature is known (then ``name`` is the issuer's name and the serial,
    as the kernel would describe a self-signed certificate without SKID, or the SKID alone).
    """

    name: str
    issuer: str | None
    serial: str | None
    skid: str | None
    source: str | None


def key_description(subject: str, serial: bytes, skid: bytes | None) -> str:
    """``x509_key_preparse``'s description: ``"<subject>: <SKID hex, else serial hex>"``."""
    return f"{subject}: {(skid if skid is not None else serial).hex()}"


def cert_serial(cert: Cert) -> bytes:
    """A parsed certificate's serial INTEGER content octets (its id is serial || issuer)."""
    return cert.id[: len(cert.id) - len(cert.raw_issuer)]


def matches(cert: Cert, sid: SignerId) -> bool:
    """Whether the kernel would find ``cert``'s key for ``sid``: the key id equals the
    certificate's serial || issuer or its SKID (``find_asymmetric_key``, ``ex:``)."""
    return sid.key_id in (cert.id, cert.skid)


def name_certificate(cert: Cert, source: str) -> SignerName:
    """The key of a known certificate, named as the kernel names it."""
    serial = cert_serial(cert)
    return SignerName(
        key_description(cert.subject, serial, cert.skid),
        distinguished_name(cert.raw_issuer),
        serial.hex(),
        None if cert.skid is None else cert.skid.hex(),
        source,
    )


def name_signature(sid: SignerId) -> SignerName:
    """The key as only the signature names it: the issuer's name (``x509_fabricate_name``)
    and the serial for issuer+serial, :data:`UNNAMED` and the SKID for an SKID."""
    if sid.skid is not None or sid.serial is None or sid.issuer is None:
        skid = sid.skid if sid.skid is not None else sid.key_id
        return SignerName(f"{UNNAMED}: {skid.hex()}", None, None, skid.hex(), None)
    issuer = issuer_name(sid.serial, sid.issuer)
    return SignerName(
        f"{'(unreadable issuer)' if issuer is None else issuer}: {sid.serial.hex()}",
        distinguished_name(sid.issuer),
        sid.serial.hex(),
        None,
        None,
    )


# RFC 4514's names for attribute types (others are written as dotted OIDs), as
# cryptography's ``Name.rfc4514_string`` writes them.
_SHORT = {
    "2.5.4.3": "CN",
    "2.5.4.6": "C",
    "2.5.4.7": "L",
    "2.5.4.8": "ST",
    "2.5.4.9": "STREET",
    "2.5.4.10": "O",
    "2.5.4.11": "OU",
    "0.9.2342.19200300.100.1.25": "DC",
    "0.9.2342.19200300.100.1.1": "UID",
}
_STRINGS = {
    0x0C: "utf-8",  # UTF8String
    0x13: "ascii",  # PrintableString
    0x16: "ascii",  # IA5String
    0x12: "ascii",  # NumericString
    0x14: "latin-1",  # TeletexString, as OpenSSL reads it
    0x1E: "utf-16-be",  # BMPString
    0x1C: "utf-32-be",  # UniversalString
}


def _tlvs(data: bytes) -> list[tuple[int, bytes, bytes]]:
    """The DER elements of ``data`` as (tag, content, whole element); raises ValueError when
    malformed."""
    out, at = [], 0
    while at < len(data):
        if at + 2 > len(data):
            raise ValueError("truncated")
        start, tag, length, at = at, data[at], data[at + 1], at + 2
        if length & 0x80:
            count = length & 0x7F
            if not 0 < count <= 4 or at + count > len(data):
                raise ValueError("bad length")
            length, at = int.from_bytes(data[at : at + count], "big"), at + count
        if at + length > len(data):
            raise ValueError("truncated")
        out.append((tag, data[at : at + length], data[start : at + length]))
        at += length
    return out


def _escape(value: str) -> str:
    """An attribute value escaped as RFC 4514 (section 2.4) wants."""
    for char in ("\\", '"', "+", ",", ";", "<", ">"):
        value = value.replace(char, "\\" + char)
    value = value.replace("\0", "\\00")
    if value[:1] in ("#", " "):
        value = "\\" + value
    if value.endswith(" "):
        value = value[:-1] + "\\ "
    return value


def distinguished_name(content: bytes) -> str | None:
    """A Name's content octets (a run of RDN SETs) as an RFC 4514 string, last RDN first
    (``CN=Signing key,O=Example GPU vendor,C=US``); None when it does not parse."""
    rdns = []
    try:
        for tag, rdn, _ in _tlvs(content):
            if tag != 0x31:
                raise ValueError("not an RDN SET")
            parts = []
            for seq_tag, atv, _ in _tlvs(rdn):
                (oid_tag, oid, _), (value_tag, value, element) = _tlvs(atv)
                if seq_tag != 0x30 or oid_tag != 0x06:
                    raise ValueError("not an AttributeTypeAndValue")
                dotted = decode(oid)
                encoding = _STRINGS.get(value_tag)
                text = (
                    _escape(value.decode(encoding, "replace")) if encoding else "#" + element.hex()
                )
                parts.append(f"{_SHORT.get(dotted, dotted)}={text}")
            rdns.append("+".join(parts))
    except ValueError:
        return None
    return ",".join(reversed(rdns))

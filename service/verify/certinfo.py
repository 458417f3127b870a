"""The fields a trusted certificate is filed under, read from plain DER without libraries.

:class:`~service.verify.trust.TrustedKey` needs a certificate's serial and issuer (the
kernel's key id), its subjectKeyIdentifier and the subject's commonName, and checks that
its key is usable. asn1crypto and cryptography do that for any certificate, but cost the
boot path (which reads the trusted certificates on every boot) a fifth of its time in
imports. :func:`plain_fields` reads the common case, strict DER with an RSA key and a
commonName in UTF8String, PrintableString or IA5String, and raises :class:`NotPlain` for
anything else, which then goes to those libraries as before: the result is the same
either way, only the cost differs.
"""

from __future__ import annotations

from typing import NamedTuple

_SEQ, _SET, _INT, _BITS, _OCTETS, _NULL, _OID, _BOOL = 0x30, 0x31, 2, 3, 4, 5, 6, 1
_CN = bytes.fromhex("550403")
_NAME_TYPES = (_CN, bytes.fromhex("55040a"), bytes.fromhex("55040b"))  # CN, O, OU
_SKID = bytes.fromhex("551d0e")
# extensions asn1crypto parses (by their outer tag) when it looks for the SKID; others
# it would parse too are left to it
_EXTENSIONS = {
    _SKID: _OCTETS,
    bytes.fromhex("551d23"): _SEQ,  # authorityKeyIdentifier
    bytes.fromhex("551d13"): _SEQ,  # basicConstraints
    bytes.fromhex("551d0f"): _BITS,  # keyUsage
    bytes.fromhex("551d25"): _SEQ,  # extKeyUsage
}
_RSA = bytes.fromhex("2a864886f70d010101")
_STRINGS = {0x0C: "utf-8", 0x13: "ascii", 0x16: "ascii"}


class NotPlain(Exception):
    """The certificate is not in the plain form :func:`plain_fields` reads."""


class CertFields(NamedTuple):
    """What the trust store files a certificate under."""

    serial: bytes  # content octets of the serialNumber INTEGER
    issuer: bytes  # content octets of the issuer Name
    common_name: str  # the subject's first commonName
    skid: bytes | None  # the subjectKeyIdentifier, if the certificate has one


def _tlv(data: bytes, at: int, end: int) -> tuple[int, int, int]:
    """(tag, content start, content end) of the DER element at ``at``; strict and bounded."""
    if end - at < 2 or data[at] & 0x1F == 0x1F:
        raise NotPlain("short element or long-form tag")
    tag, first, at = data[at], data[at + 1], at + 2
    if first < 0x80:
        length = first
    else:
        count = first & 0x7F
        if not 1 <= count <= 3 or at + count > end or data[at] == 0:
            raise NotPlain("indefinite or non-minimal length")
        length = int.from_bytes(data[at : at + count], "big")
        at += count
        if length < 0x80:
            raise NotPlain("non-minimal length")
    if at + length > end:
        raise NotPlain("element overruns its container")
    return tag, at, at + length


def _children(data: bytes, start: int, end: int) -> list[tuple[int, int, int]]:
    out = []
    while start < end:
        tag, s, e = _tlv(data, start, end)
        out.append((tag, s, e))
        start = e
    return out


def _expect(items: list[tuple[int, int, int]], *tags: int) -> None:
    if [t for t, _s, _e in items] != list(tags):
        raise NotPlain("unexpected structure")


def _integer(data: bytes, s: int, e: int) -> int:
    value = data[s:e]
    if not value or value[0] & 0x80 or (len(value) > 1 and value[0] == 0 and value[1] < 0x80):
        raise NotPlain("negative or non-minimal INTEGER")
    return int.from_bytes(value, "big")


def _rsa_key(data: bytes, s: int, e: int) -> None:
    """An rsaEncryption SubjectPublicKeyInfo whose key any library loads."""
    items = _children(data, s, e)
    _expect(items, _SEQ, _BITS)
    alg, key = items
    parts = _children(data, alg[1], alg[2])
    _expect(parts, _OID, _NULL)
    if data[parts[0][1] : parts[0][2]] != _RSA or parts[1][1] != parts[1][2]:
        raise NotPlain("not an rsaEncryption key")
    if key[2] - key[1] < 2 or data[key[1]] != 0:
        raise NotPlain("key BIT STRING with unused bits")
    tag, rs, re_ = _tlv(data, key[1] + 1, key[2])
    if tag != _SEQ or re_ != key[2]:
        raise NotPlain("RSAPublicKey is not one SEQUENCE")
    numbers = _children(data, rs, re_)
    _expect(numbers, _INT, _INT)
    n, exp = (_integer(data, ns, ne) for _t, ns, ne in numbers)
    if n.bit_length() < 512 or not n & 1 or exp < 3 or not exp & 1:
        raise NotPlain("unusual RSA numbers")


def _common_name(data: bytes, s: int, e: int) -> str:
    names = []
    for tag, rs, re_ in _children(data, s, e):
        if tag != _SET:
            raise NotPlain("RDN is not a SET")
        for atag, a_s, a_e in _children(data, rs, re_):
            parts = _children(data, a_s, a_e) if atag == _SEQ else []
            if [t for t, _s, _e in parts[:1]] != [_OID] or len(parts) != 2:
                raise NotPlain("attribute is not (type, value)")
            kind = data[parts[0][1] : parts[0][2]]
            encoding = _STRINGS.get(parts[1][0])
            if kind not in _NAME_TYPES or encoding is None:
                raise NotPlain("another attribute or string type")
            if kind == _CN:
                try:
                    names.append(data[parts[1][1] : parts[1][2]].decode(encoding))
                except UnicodeDecodeError as exc:
                    raise NotPlain("commonName does not decode") from exc
    if not names:
        raise NotPlain("no commonName")
    return names[0]


def _skid(data: bytes, s: int, e: int) -> bytes | None:
    (tag, xs, xe), *rest = _children(data, s, e) or [(0, 0, 0)]
    if tag != _SEQ or rest:
        raise NotPlain("extensions are not one SEQUENCE")
    found: bytes | None = None
    for etag, es, ee in _children(data, xs, xe):
        parts = _children(data, es, ee) if etag == _SEQ else []
        tags = [t for t, _s, _e in parts]
        if tags not in ([_OID, _OCTETS], [_OID, _BOOL, _OCTETS]):
            raise NotPlain("unexpected extension")
        if len(parts) == 3 and data[parts[1][1] : parts[1][2]] != b"\xff":
            raise NotPlain("critical flag other than DER TRUE")
        oid = data[parts[0][1] : parts[0][2]]
        want = _EXTENSIONS.get(oid)
        if want is None:
            raise NotPlain("an extension left to asn1crypto")
        vtag, vs, ve = _tlv(data, parts[-1][1], parts[-1][2])
        if vtag != want or ve != parts[-1][2]:
            raise NotPlain("extension value of another shape")
        if oid == _SKID:
            if found is not None or vs == ve:
                raise NotPlain("unusual subjectKeyIdentifier")
            found = data[vs:ve]
    return found


def plain_fields(der: bytes) -> CertFields:
    """The filing fields of a plain DER certificate; raises :class:`NotPlain` otherwise."""
    tag, s, e = _tlv(der, 0, len(der))
    if tag != _SEQ or e != len(der):
        raise NotPlain("not one DER SEQUENCE")
    top = _children(der, s, e)
    _expect(top, _SEQ, _SEQ, _BITS)
    tbs = _children(der, top[0][1], top[0][2])
    if tbs and tbs[0][0] == 0xA0:
        _expect(_children(der, tbs[0][1], tbs[0][2]), _INT)
        tbs = tbs[1:]
    _expect(tbs[:6], _INT, _SEQ, _SEQ, _SEQ, _SEQ, _SEQ)
    extra = [t for t, _s, _e in tbs[6:]]
    if extra not in ([], [0xA3], [0x81, 0xA3], [0x82, 0xA3], [0x81, 0x82, 0xA3]):
        raise NotPlain("unexpected fields after the key")
    serial, _alg, issuer, _validity, subject, spki = tbs[:6]
    if serial[1] == serial[2]:
        raise NotPlain("empty serial")
    _rsa_key(der, spki[1], spki[2])
    skid = _skid(der, tbs[-1][1], tbs[-1][2]) if extra else None
    return CertFields(
        der[serial[1] : serial[2]],
        der[issuer[1] : issuer[2]],
        _common_name(der, subject[1], subject[2]),
        skid,
    )

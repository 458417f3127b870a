"""The object identifiers the kernel's PKCS#7 and X.509 parsers know (include/linux/oid_registry.h).

``look_up_OID`` compares the encoded bytes exactly; an OID not in the registry is
``None`` here (``OID__NR`` there), which the actions treat as unsupported.
"""

from __future__ import annotations

_DOTTED = {
    "1.2.840.10045.2.1": "id_ecPublicKey",
    "1.2.840.10045.3.1.1": "id_prime192v1",
    "1.2.840.10045.3.1.7": "id_prime256v1",
    "1.2.840.10045.4.1": "id_ecdsa_with_sha1",
    "1.2.840.10045.4.3.1": "id_ecdsa_with_sha224",
    "1.2.840.10045.4.3.2": "id_ecdsa_with_sha256",
    "1.2.840.10045.4.3.3": "id_ecdsa_with_sha384",
    "1.2.840.10045.4.3.4": "id_ecdsa_with_sha512",
    "1.2.840.113549.1.1.1": "rsaEncryption",
    "1.2.840.113549.1.1.2": "md2WithRSAEncryption",
    "1.2.840.113549.1.1.3": "md3WithRSAEncryption",
    "1.2.840.113549.1.1.4": "md4WithRSAEncryption",
    "1.2.840.113549.1.1.5": "sha1WithRSAEncryption",
    "1.2.840.113549.1.1.11": "sha256WithRSAEncryption",
    "1.2.840.113549.1.1.12": "sha384WithRSAEncryption",
    "1.2.840.113549.1.1.13": "sha512WithRSAEncryption",
    "1.2.840.113549.1.1.14": "sha224WithRSAEncryption",
    "1.2.840.113549.1.7.1": "data",
    "1.2.840.113549.1.7.2": "signed_data",
    "1.2.840.113549.1.9.1": "email_address",
    "1.2.840.113549.1.9.3": "contentType",
    "1.2.840.113549.1.9.4": "messageDigest",
    "1.2.840.113549.1.9.5": "signingTime",
    "1.2.840.113549.1.9.15": "smimeCapabilites",
    "1.2.840.113549.1.9.16.2.11": "smimeAuthenticatedAttrs",
    "1.2.840.113549.2.4": "md4",
    "1.2.840.113549.2.5": "md5",
    "1.3.6.1.4.1.311.2.1.4": "msIndirectData",
    "1.3.6.1.4.1.311.2.1.11": "msStatementType",
    "1.3.6.1.4.1.311.2.1.12": "msSpOpusInfo",
    "1.3.14.3.2.26": "sha1",
    "1.3.132.0.34": "id_ansip384r1",
    "2.16.840.1.101.3.4.2.1": "sha256",
    "2.16.840.1.101.3.4.2.2": "sha384",
    "2.16.840.1.101.3.4.2.3": "sha512",
    "2.16.840.1.101.3.4.2.4": "sha224",
    "2.16.840.1.101.3.4.2.8": "sha3_256",  # the SHA-3 OIDs are 6.12's registry's (6.7 on)
    "2.16.840.1.101.3.4.2.9": "sha3_384",
    "2.16.840.1.101.3.4.2.10": "sha3_512",
    "2.16.840.1.101.3.4.3.10": "id_ecdsa_with_sha3_256",
    "2.16.840.1.101.3.4.3.11": "id_ecdsa_with_sha3_384",
    "2.16.840.1.101.3.4.3.12": "id_ecdsa_with_sha3_512",
    "2.16.840.1.101.3.4.3.14": "id_rsassa_pkcs1_v1_5_with_sha3_256",
    "2.16.840.1.101.3.4.3.15": "id_rsassa_pkcs1_v1_5_with_sha3_384",
    "2.16.840.1.101.3.4.3.16": "id_rsassa_pkcs1_v1_5_with_sha3_512",
    "2.16.840.1.101.3.4.3.17": "id_ml_dsa_44",  # 7.0's registry on
    "2.16.840.1.101.3.4.3.18": "id_ml_dsa_65",
    "2.16.840.1.101.3.4.3.19": "id_ml_dsa_87",
    "2.5.4.3": "commonName",
    "2.5.4.10": "organizationName",
    "2.5.29.14": "subjectKeyIdentifier",
    "2.5.29.15": "keyUsage",
    "2.5.29.19": "basicConstraints",
    "2.5.29.35": "authorityKeyIdentifier",
    "1.2.643.7.1.1.1.1": "gost2012PKey256",
    "1.2.643.7.1.1.1.2": "gost2012PKey512",
    "1.2.643.7.1.1.2.2": "gost2012Digest256",
    "1.2.643.7.1.1.2.3": "gost2012Digest512",
    "1.2.643.7.1.1.3.2": "gost2012Signature256",
    "1.2.643.7.1.1.3.3": "gost2012Signature512",
    "1.2.156.10197.1.301": "sm2",
    "1.2.156.10197.1.401": "sm3",
    "1.2.156.10197.1.501": "SM2_with_SM3",
    "1.2.156.10197.1.504": "sm3WithRSAEncryption",
}


def encode(dotted: str) -> bytes:
    """The DER content octets of an OBJECT IDENTIFIER."""
    arcs = [int(a) for a in dotted.split(".")]
    out = bytearray([arcs[0] * 40 + arcs[1]])
    for arc in arcs[2:]:
        chunk = [arc & 0x7F]
        arc >>= 7
        while arc:
            chunk.append(0x80 | (arc & 0x7F))
            arc >>= 7
        out += bytes(reversed(chunk))
    return bytes(out)


def decode(raw: bytes) -> str:
    """Dotted form of OID content octets (for messages); ``?`` when malformed."""
    if not raw:
        return "?"
    arcs = [str(min(raw[0] // 40, 2)), str(raw[0] - 40 * min(raw[0] // 40, 2))]
    value = 0
    for byte in raw[1:]:
        value = (value << 7) | (byte & 0x7F)
        if not byte & 0x80:
            arcs.append(str(value))
            value = 0
    return ".".join(arcs)


_BY_BYTES = {encode(d): name for d, name in _DOTTED.items()}


def look_up(raw: bytes) -> str | None:
    """The registry name of OID content octets, or None (the kernel's ``OID__NR``)."""
    return _BY_BYTES.get(bytes(raw))

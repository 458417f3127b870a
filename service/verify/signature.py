"""The appended module signature: trailer, PKCS#7 structure, public-key check.

A signed module is ``[signed bytes][PKCS#7 DER][struct module_signature][MARKER]``. The
functions here apply the kernel's checks in the kernel's order and raise
:class:`~service.errors.ModuleRejected` with the errno the kernel would return:

* :func:`parse_trailer` mirrors ``module_sig_check`` + ``mod_check_sig``
  (kernel/module/signing.c, kernel/module_signature.c);
* :func:`parse_pkcs7` mirrors ``pkcs7_parse_message`` and the module-usage rules of
  ``pkcs7_verify`` (crypto/asymmetric_keys/pkcs7_parser.c, pkcs7_verify.c), parsed
  strictly with asn1crypto;
* :func:`check_signature` is the key operation, over a digest the caller computed while
  streaming the module (cryptography's ``Prehashed``), as ``public_key_verify_signature``.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

from asn1crypto import cms, core
from cryptography.exceptions import InvalidSignature, UnsupportedAlgorithm
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.asymmetric import ec, padding, rsa, utils

from service.errors import ModuleRejected

MARKER = b"~Module signature appended~\n"
INFO = struct.Struct(">BBBBB3sI")  # algo, hash, id_type, signer_len, key_id_len, pad, sig_len
PKEY_ID_PKCS7 = 2
MAX_SIG_LEN = 64 * 1024  # modstage policy: real blobs are < 1 KiB
TAIL = len(MARKER) + INFO.size


@dataclass(frozen=True)
class Digest:
    """A digest algorithm the kernel accepts for module signatures."""

    name: str  # the kernel's and hashlib's name
    algorithm: type[hashes.HashAlgorithm]
    since: tuple[int, int]  # first kernel (major, minor) whose PKCS#7 parser knows it


DIGESTS = {
    "2.16.840.1.101.3.4.2.4": Digest("sha224", hashes.SHA224, (4, 3)),
    "2.16.840.1.101.3.4.2.1": Digest("sha256", hashes.SHA256, (4, 3)),
    "2.16.840.1.101.3.4.2.2": Digest("sha384", hashes.SHA384, (4, 3)),
    "2.16.840.1.101.3.4.2.3": Digest("sha512", hashes.SHA512, (4, 3)),
    "2.16.840.1.101.3.4.2.8": Digest("sha3_256", hashes.SHA3_256, (6, 7)),
    "2.16.840.1.101.3.4.2.9": Digest("sha3_384", hashes.SHA3_384, (6, 7)),
    "2.16.840.1.101.3.4.2.10": Digest("sha3_512", hashes.SHA3_512, (6, 7)),
}
SHA1_OID = "1.3.14.3.2.26"
RSA_ENCRYPTION = "1.2.840.113549.1.1.1"
ECDSA_OIDS = {
    "1.2.840.10045.4.1": "ecdsa-with-SHA1",
    "1.2.840.10045.4.3.1": "ecdsa-with-SHA224",
    "1.2.840.10045.4.3.2": "ecdsa-with-SHA256",
    "1.2.840.10045.4.3.3": "ecdsa-with-SHA384",
    "1.2.840.10045.4.3.4": "ecdsa-with-SHA512",
    "2.16.840.1.101.3.4.3.10": "ecdsa-with-SHA3-256",
    "2.16.840.1.101.3.4.3.11": "ecdsa-with-SHA3-384",
    "2.16.840.1.101.3.4.3.12": "ecdsa-with-SHA3-512",
}
# The curves the kernel's ecdsa driver registers (crypto/ecdsa.c).
KERNEL_CURVES = ("secp192r1", "secp256r1", "secp384r1")


@dataclass(frozen=True)
class Trailer:
    """Where the signature sits: bytes ``[0, signed_len)`` are signed, the blob follows."""

    signed_len: int
    sig_len: int


@dataclass(frozen=True)
class Signature:
    """One SignerInfo, reduced to what the key operation and the key lookup need."""

    digest: Digest
    key_type: str  # "rsa" | "ecdsa"
    value: bytes
    key_id: bytes  # the kernel's key id: serial || issuer content octets, or the SKID


def parse_trailer(tail: bytes, file_len: int) -> Trailer:
    """Check the last ``min(file_len, 40)`` bytes of a module the way the kernel does."""
    if len(tail) < min(file_len, TAIL):
        raise ModuleRejected("EIO: short read of the signature trailer")
    if file_len <= len(MARKER) or not tail.endswith(MARKER):
        raise ModuleRejected("ENODATA: module is unsigned (no signature marker)")
    modlen = file_len - len(MARKER)
    if modlen <= INFO.size:
        raise ModuleRejected("EBADMSG: file too short for struct module_signature")
    algo, hash_, id_type, signer_len, key_id_len, pad, sig_len = INFO.unpack(tail[-TAIL:-28])
    if sig_len >= modlen - INFO.size:
        raise ModuleRejected(f"EBADMSG: sig_len {sig_len} does not fit in the file")
    if id_type != PKEY_ID_PKCS7:
        raise ModuleRejected(f"ENOPKG: signature id_type {id_type} is not PKCS#7 (2)")
    if algo or hash_ or signer_len or key_id_len or pad != b"\0\0\0":
        raise ModuleRejected("EBADMSG: module_signature has non-zero algo/hash/len/pad fields")
    if sig_len > MAX_SIG_LEN:
        raise ModuleRejected(f"EBADMSG: sig_len {sig_len} exceeds the {MAX_SIG_LEN}-byte cap")
    return Trailer(signed_len=modlen - INFO.size - sig_len, sig_len=sig_len)


def _small_int(value: core.Integer) -> int:
    raw = value.contents or b""
    return raw[0] if len(raw) == 1 else -1  # the kernel takes one-byte versions only


def _digest(oid: str, kernel: tuple[int, int]) -> Digest:
    if oid == SHA1_OID:
        raise ModuleRejected("ENOPKG: SHA-1 module signatures are refused (mainline removed them)")
    digest = DIGESTS.get(oid)
    if digest is None or kernel < digest.since:
        raise ModuleRejected(f"ENOPKG: digest algorithm {oid} is not supported by the kernel")
    return digest


def _key_type(oid: str) -> str:
    if oid == RSA_ENCRYPTION:
        return "rsa"
    if oid in ECDSA_OIDS and oid != "1.2.840.10045.4.1":
        return "ecdsa"
    raise ModuleRejected(
        f"ENOPKG: signature algorithm {oid} is not accepted "
        "(RSA must be rsaEncryption, ECDSA ecdsa-with-SHA2/SHA3)"
    )


def _signer(info: cms.SignerInfo, sd_version: int, kernel: tuple[int, int]) -> Signature:
    version = _small_int(info["version"])
    if version not in (1, 3):
        raise ModuleRejected(f"EINVAL: unsupported SignerInfo version {version}")
    if (version == 1) != (sd_version == 1):
        raise ModuleRejected("EBADMSG: SignerInfo version does not match SignedData version")
    sid = info["sid"]
    if version == 1 and sid.name == "issuer_and_serial_number":
        ias = sid.chosen
        key_id = bytes(ias["serial_number"].contents) + bytes(ias["issuer"].chosen.contents)
    elif version == 3 and sid.name == "subject_key_identifier":
        key_id = bytes(sid.chosen.contents)
    else:
        raise ModuleRejected(f"EBADMSG: SignerInfo v{version} with a {sid.name} identifier")
    digest = _digest(info["digest_algorithm"]["algorithm"].dotted, kernel)
    key_type = _key_type(info["signature_algorithm"]["algorithm"].dotted)
    if not isinstance(info["signed_attrs"], core.Void):
        raise ModuleRejected("EKEYREJECTED: module signature has signed attributes")
    return Signature(digest, key_type, bytes(info["signature"].contents), key_id)


def _parse(blob: bytes, kernel: tuple[int, int]) -> tuple[Signature, ...]:
    info = cms.ContentInfo.load(blob, strict=True)
    if info["content_type"].dotted != "1.2.840.113549.1.7.2":
        raise ModuleRejected("EINVAL: PKCS#7 content type is not signedData")
    sd = info["content"]
    sd_version = _small_int(sd["version"])
    if sd_version not in (1, 3):
        raise ModuleRejected(f"EINVAL: unsupported SignedData version {sd_version}")
    encap = sd["encap_content_info"]
    if encap["content_type"].dotted != "1.2.840.113549.1.7.1":
        raise ModuleRejected("EINVAL: signed content type is not data")
    if not isinstance(encap["content"], core.Void):
        raise ModuleRejected("EBADMSG: signature is not detached (embedded content)")
    signers = tuple(_signer(si, sd_version, kernel) for si in sd["signer_infos"])
    if not signers:
        raise ModuleRejected("EBADMSG: PKCS#7 message has no SignerInfo")
    return signers


def parse_pkcs7(blob: bytes, kernel: tuple[int, int] = (99, 0)) -> tuple[Signature, ...]:
    """Parse the detached PKCS#7 ``blob`` and apply the kernel's module rules.

    ``kernel`` is the target's (major, minor): digests newer than it are refused.
    Only :class:`ModuleRejected` escapes, whatever the bytes.
    """
    try:
        return _parse(blob, kernel)
    except ModuleRejected:
        raise
    except (ValueError, TypeError, KeyError, IndexError, OverflowError, RecursionError) as exc:
        raise ModuleRejected(f"EBADMSG: malformed PKCS#7: {exc}") from exc


def check_signature(sig: Signature, key: object, digest: bytes) -> None:
    """Verify ``sig`` over the precomputed ``digest`` with the trusted public ``key``."""
    algorithm: hashes.HashAlgorithm = sig.digest.algorithm()
    try:
        if sig.key_type == "rsa" and isinstance(key, rsa.RSAPublicKey):
            key.verify(sig.value, digest, padding.PKCS1v15(), utils.Prehashed(algorithm))
            return
        if sig.key_type == "ecdsa" and isinstance(key, ec.EllipticCurvePublicKey):
            if key.curve.name not in KERNEL_CURVES:
                raise ModuleRejected(
                    f"ENOPKG: curve {key.curve.name} is not supported by the kernel"
                )
            key.verify(sig.value, digest, ec.ECDSA(utils.Prehashed(algorithm)))
            return
    except (InvalidSignature, UnsupportedAlgorithm, ValueError) as exc:
        raise ModuleRejected("EKEYREJECTED: signature does not match the module") from exc
    raise ModuleRejected(
        f"EKEYREJECTED: {sig.key_type} signature but the certificate holds another key type"
    )

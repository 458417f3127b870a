"""``public_key_verify_signature`` (crypto/asymmetric_keys/public_key.c, Linux 6.1) over a digest.

Returns the errno the kernel's key operation would return, 0 when it verifies. RSA is
done by hand (one modular exponentiation) so that the PKCS#1 v1.5 checks of
crypto/rsa-pkcs1pad.c give the same errnos: a modulus whose byte size is not one of
512/1024/1536/2048/3072/4096 bits, a signature of another length or not below the
modulus, or a decrypted block without its leading zero byte, is ``EINVAL``; bad padding
or DigestInfo ``EBADMSG``; another digest
``EKEYREJECTED``. The RSA key itself is read as ``rsa_set_pub_key`` reads it, with the
kernel's compiled ``rsapubkey.asn1`` grammar, so RSA needs no cryptography (it stays off the
boot path). ECDSA needs ``CONFIG_CRYPTO_ECDSA`` in the target (else ``ENOENT``, the missing
algorithm) and one of the curves P-192/256/384; its signature value is read as
crypto/ecdsa.c reads it, with the kernel's ``ecdsasignature.asn1`` grammar
(:func:`ecdsa_rs`), and only the curve arithmetic is cryptography's, imported when an EC key
is first used.
"""

from __future__ import annotations

import errno
from typing import Any, NamedTuple

from service.verify.signature.asn1 import Asn1Error, ber_decode
from service.verify.signature.asn1_machines import (
    ECDSASIGNATURE_ACTIONS,
    ECDSASIGNATURE_MACHINE,
    RSAPUBKEY_ACTIONS,
    RSAPUBKEY_MACHINE,
)

_MAX_MPI_BITS = 16384  # MAX_EXTERN_MPI_BITS
RSA_BITS = (512, 1024, 1536, 2048, 3072, 4096)
_DIGEST_INFO = {
    "md5": "3020300c06082a864886f70d020505000410",
    "sha1": "3021300906052b0e03021a05000414",
    "rmd160": "3021300906052b2403020105000414",
    "sha256": "3031300d060960864801650304020105000420",
    "sha384": "3041300d060960864801650304020205000430",
    "sha512": "3051300d060960864801650304020305000440",
    "sha224": "302d300d06096086480165030402040500041c",
    # 6.12's pkcs1pad; only 6.12's parsers name a SHA-3 digest (see x509.dialect)
    "sha3_256": "3031300d060960864801650304020805000420",
    "sha3_384": "3041300d060960864801650304020905000430",
    "sha3_512": "3051300d060960864801650304020a05000440",
}
_ECDSA_HASHES = ("sha1", "sha224", "sha256", "sha384", "sha512", "sha3_256", "sha3_384", "sha3_512")


class _Curve(NamedTuple):
    """A NIST curve as crypto/ecdsa.c uses it: cryptography's name, number size, group order."""

    name: str  # the class in cryptography's ``ec`` module
    size: int  # bytes in one number: the curve's ``ndigits`` times 8
    order: int  # n: r and s must lie in 1..n-1


_CURVES = {
    "ecdsa-nist-p192": _Curve(
        "SECP192R1", 24, int("ffffffffffffffffffffffff99def836146bc9b1b4d22831", 16)
    ),
    "ecdsa-nist-p256": _Curve(
        "SECP256R1",
        32,
        int("ffffffff00000000ffffffffffffffffbce6faada7179e84f3b9cac2fc632551", 16),
    ),
    "ecdsa-nist-p384": _Curve(
        "SECP384R1",
        48,
        int(
            "ffffffffffffffffffffffffffffffffffffffffffffffff"
            "c7634d81f4372ddf581a0db248b0a77aecec196accc52973",
            16,
        ),
    ),
}


class PublicKey(NamedTuple):
    """A key as the kernel holds it: algorithm name and the SubjectPublicKey bits."""

    algo: str  # "rsa", "ecdsa-nist-p256", "sm2", "ecrdsa", ...
    key: bytes  # RSAPublicKey DER, or the EC point

    def rsa_bits(self) -> int | None:
        """The modulus size the kernel checks (its byte length times 8), for RSA keys."""
        n = rsa_numbers(self.key)
        return None if isinstance(n, int) else _byte_len(n[0]) * 8


class SigParams(NamedTuple):
    """What the key operation needs from a signature."""

    pkey_algo: str | None  # "rsa", "ecdsa", ...
    encoding: str | None  # "pkcs1", "x962", "raw"
    hash_algo: str | None
    s: bytes
    digest: bytes


def _byte_len(n: int) -> int:
    return (n.bit_length() + 7) // 8


def rsa_numbers(key: bytes) -> tuple[int, int] | int:
    """(n, e) as ``rsa_set_pub_key`` reads them, or the errno it returns.

    crypto/rsapubkey.asn1 run by the kernel's BER decoder (a malformed key is its errno,
    ``EBADMSG``); ``rsa_get_n``/``rsa_get_e`` refuse an empty ``n`` or ``e`` and an ``e``
    longer than ``n`` (``EINVAL``); both are unsigned big-endian numbers
    (``mpi_read_raw_data``), at most 16384 bits (else ``ENOMEM``).
    """
    found: dict[str, bytes] = {}

    def get(name: str) -> Any:
        def action(hdr: int, tag: int, at: int, n: int) -> None:
            if not n or (name == "e" and n > len(found.get("n", b""))):
                raise Asn1Error(errno.EINVAL, f"RSA public key: {name} is empty or too long")
            found[name] = key[at : at + n]

        return action

    actions = {"rsa_get_n": get("n"), "rsa_get_e": get("e")}
    try:
        ber_decode(RSAPUBKEY_MACHINE, [actions[a] for a in RSAPUBKEY_ACTIONS], key)
    except Asn1Error as exc:
        return exc.code
    if "n" not in found or "e" not in found:
        return errno.EBADMSG
    n, e = (int.from_bytes(found[k], "big") for k in ("n", "e"))
    if max(n.bit_length(), e.bit_length()) > _MAX_MPI_BITS:
        return errno.ENOMEM
    return n, e


def _rsa(pub: PublicKey, sig: SigParams) -> int:
    numbers = rsa_numbers(pub.key)
    if isinstance(numbers, int):
        return numbers
    n, e = numbers
    size = _byte_len(n)
    if size * 8 not in RSA_BITS:
        return errno.EINVAL
    if sig.encoding != "pkcs1" or not sig.digest:
        return errno.EINVAL
    info = _DIGEST_INFO.get(sig.hash_algo or "")
    if info is None:
        return errno.ENOENT  # no pkcs1pad(rsa,<hash>) instance
    if len(sig.s) != size:
        return errno.EINVAL
    s = int.from_bytes(sig.s, "big")
    if s >= n:
        return errno.EINVAL
    m = pow(s, e, n)
    out = m.to_bytes(_byte_len(m), "big") if m else b""  # mpi_write_to_sgl: no leading zeros
    if len(out) < size - 1 or len(out) == size:  # too short, or no leading 0 byte: EINVAL
        return errno.EINVAL
    if not out or out[0] != 0x01:
        return errno.EBADMSG
    pos = 1
    while pos < len(out) and out[pos] == 0xFF:
        pos += 1
    if pos < 9 or pos == len(out) or out[pos] != 0:
        return errno.EBADMSG
    pos += 1
    prefix = bytes.fromhex(info)
    if len(prefix) > len(out) - pos or out[pos : pos + len(prefix)] != prefix:
        return errno.EBADMSG
    pos += len(prefix)
    return 0 if out[pos:] == sig.digest else errno.EKEYREJECTED


def _ecdsa(pub: PublicKey, sig: SigParams, have_ecdsa: bool) -> int:
    if sig.encoding != "x962" or sig.hash_algo not in _ECDSA_HASHES:
        return errno.EINVAL
    curve = _CURVES.get(pub.algo)
    if curve is None or not have_ecdsa:
        return errno.ENOENT
    # an EC key is rare on a module-signing keyring: its libraries load only when one is used
    from cryptography.exceptions import InvalidSignature
    from cryptography.hazmat.primitives import hashes
    from cryptography.hazmat.primitives.asymmetric import ec, utils

    if pub.key[:1] != b"\x04":  # ecdsa_set_pub_key takes uncompressed points only
        return errno.EINVAL
    try:
        key = ec.EllipticCurvePublicKey.from_encoded_point(getattr(ec, curve.name)(), pub.key)
    except ValueError:
        return errno.EINVAL
    rs = ecdsa_rs(sig.s, curve.size)
    if isinstance(rs, int):
        return rs
    if not all(0 < v < curve.order for v in rs):  # _ecdsa_verify
        return errno.EBADMSG
    algorithm = getattr(hashes, (sig.hash_algo or "sha256").upper())()
    if len(sig.digest) != algorithm.digest_size:
        return errno.EKEYREJECTED
    try:
        key.verify(
            utils.encode_dss_signature(*rs), sig.digest, ec.ECDSA(utils.Prehashed(algorithm))
        )
    except (InvalidSignature, ValueError):
        return errno.EKEYREJECTED
    return 0


def ecdsa_rs(value: bytes, size: int) -> tuple[int, int] | int:
    """(r, s) of an ECDSA-Sig-Value as ``ecdsa_verify`` reads it, or the errno it returns.

    crypto/ecdsasignature.asn1 run by the kernel's BER decoder (a malformed value is its
    errno, ``EBADMSG``; bytes after the SEQUENCE are ignored); ``ecdsa_get_signature_rs``
    takes each INTEGER's content as an unsigned big-endian number of the curve's ``size``
    bytes: an empty one is ``EINVAL``, a longer one is allowed one leading zero byte (the
    sign byte DER adds) and is otherwise ``EINVAL``, a shorter one is zero-extended.
    """
    found: dict[str, int] = {}

    def get(name: str) -> Any:
        def action(hdr: int, tag: int, at: int, n: int) -> None:
            number = value[at : at + n]
            if not number:
                raise Asn1Error(errno.EINVAL, f"ECDSA signature: {name} is empty")
            if n > size and (n > size + 1 or number[0] != 0):
                raise Asn1Error(errno.EINVAL, f"ECDSA signature: {name} is over {size} bytes")
            found[name] = int.from_bytes(number, "big")

        return action

    actions = {"ecdsa_get_signature_r": get("r"), "ecdsa_get_signature_s": get("s")}
    try:
        ber_decode(ECDSASIGNATURE_MACHINE, [actions[a] for a in ECDSASIGNATURE_ACTIONS], value)
    except Asn1Error as exc:
        return exc.code
    return found["r"], found["s"]


def verify_signature(pub: PublicKey, sig: SigParams, *, have_ecdsa: bool) -> int:
    """The kernel's ``public_key_verify_signature``: 0, or the errno it returns."""
    ec_match = pub.algo.startswith("ecdsa-") and sig.pkey_algo == "ecdsa"
    if sig.pkey_algo and pub.algo != sig.pkey_algo and not ec_match:
        return errno.EKEYREJECTED
    if pub.algo == "rsa":
        return _rsa(pub, sig)
    if pub.algo.startswith("ecdsa"):
        return _ecdsa(pub, sig, have_ecdsa)
    return errno.ENOENT  # sm2, ecrdsa: not modelled, treated as an algorithm the target lacks

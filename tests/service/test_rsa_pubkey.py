"""RSA module signatures are checked without cryptography, and agree with it exactly.

The boot path verifies RSA PKCS#1 v1.5 signatures with one modular exponentiation and
reads public keys with the kernel's own grammar (crypto/rsapubkey.asn1), so that it need
not import cryptography. These tests hold that verdict to cryptography's on many keys,
sizes, exponents, digests and damaged signatures.
"""

from __future__ import annotations

import errno
import functools
import hashlib
import math

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import padding, rsa, utils
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from service.verify.signature.pubkey import PublicKey, SigParams, rsa_numbers, verify_signature

SIZES = (1024, 1536, 2048, 3072)
EXPONENTS = (3, 17, 65537, 2**31 - 1)
HASHES = {"sha1": hashes.SHA1, "sha224": hashes.SHA224, "sha256": hashes.SHA256}
HASHES |= {"sha384": hashes.SHA384, "sha512": hashes.SHA512}


@functools.cache
def private(bits: int, exponent: int) -> rsa.RSAPrivateKey:
    """One key per (size, exponent), made once per test run.

    cryptography generates keys with e = 3 or 65537 only: other exponents reuse the
    primes of the 65537 key (the next odd exponent prime to both p-1 and q-1).
    """
    if exponent in (3, 65537):
        return rsa.generate_private_key(public_exponent=exponent, key_size=bits)
    base = private(bits, 65537).private_numbers()
    p, q = base.p, base.q
    e = exponent
    while math.gcd(e, (p - 1) * (q - 1)) != 1:
        e += 2
    d = pow(e, -1, (p - 1) * (q - 1))
    numbers = rsa.RSAPrivateNumbers(
        p,
        q,
        d,
        rsa.rsa_crt_dmp1(d, p),
        rsa.rsa_crt_dmq1(d, q),
        rsa.rsa_crt_iqmp(p, q),
        rsa.RSAPublicNumbers(e, p * q),
    )
    return numbers.private_key(unsafe_skip_rsa_key_validation=True)


def public_der(key: rsa.RSAPrivateKey) -> bytes:
    """The RSAPublicKey DER a certificate's subjectPublicKey BIT STRING holds."""
    return key.public_key().public_bytes(
        serialization.Encoding.DER, serialization.PublicFormat.PKCS1
    )


def cryptography_says(key: rsa.RSAPrivateKey, sig: bytes, digest: bytes, algo: str) -> bool:
    """cryptography's verdict on a PKCS#1 v1.5 signature over a precomputed digest."""
    try:
        key.public_key().verify(sig, digest, padding.PKCS1v15(), utils.Prehashed(HASHES[algo]()))
    except (InvalidSignature, ValueError):
        return False
    return True


DAMAGE = st.sampled_from(["none", "flip", "short", "long", "zero", "digest", "hash", "modulus"])


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    st.sampled_from(SIZES),
    st.sampled_from(EXPONENTS),
    st.sampled_from(sorted(HASHES)),
    st.binary(min_size=1, max_size=64),
    DAMAGE,
    st.integers(0, 1 << 16),
)
def test_rsa_verdict_equals_cryptographys(
    bits: int, exponent: int, algo: str, data: bytes, damage: str, where: int
) -> None:
    """0 exactly when cryptography accepts the signature; a refusal is an errno otherwise."""
    key = private(bits, exponent)
    digest = hashlib.new(algo, data).digest()
    sig = key.sign(digest, padding.PKCS1v15(), utils.Prehashed(HASHES[algo]()))
    signed_algo = algo
    if damage == "flip":
        at = where % (len(sig) * 8)
        sig = bytearray(sig)
        sig[at // 8] ^= 1 << (at % 8)
        sig = bytes(sig)
    elif damage == "short":
        sig = sig[1:]
    elif damage == "long":
        sig = b"\0" + sig
    elif damage == "zero":
        sig = bytes(len(sig))
    elif damage == "digest":
        digest = hashlib.new(algo, data + b"x").digest()
    elif damage == "hash":
        algo = "sha256" if algo != "sha256" else "sha512"
        digest = hashlib.new(algo, data).digest()
    elif damage == "modulus":
        sig = (key.public_key().public_numbers().n + where).to_bytes(len(sig) + 1, "big")[1:]
    pub = PublicKey("rsa", public_der(key))
    got = verify_signature(pub, SigParams("rsa", "pkcs1", algo, sig, digest), have_ecdsa=False)
    expected = cryptography_says(key, sig, digest, algo)
    assert (got == 0) == expected, (bits, exponent, signed_algo, algo, damage, got)
    assert got in (0, errno.EINVAL, errno.EBADMSG, errno.EKEYREJECTED)


@settings(max_examples=60, deadline=None)
@given(st.sampled_from(SIZES), st.sampled_from(EXPONENTS))
def test_public_key_numbers_are_cryptographys(bits: int, exponent: int) -> None:
    """The kernel grammar reads the same modulus and exponent as cryptography."""
    key = private(bits, exponent)
    numbers = key.public_key().public_numbers()
    assert rsa_numbers(public_der(key)) == (numbers.n, numbers.e)
    assert PublicKey("rsa", public_der(key)).rsa_bits() == bits


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=80), st.integers(0, 1 << 12), st.integers(0, 255))
def test_damaged_public_keys_are_an_errno_never_an_exception(
    noise: bytes, where: int, byte: int
) -> None:
    """Random bytes or a key with one byte changed: numbers or the kernel's errno."""
    der = bytearray(public_der(private(1024, 65537)))
    der[where % len(der)] = byte
    for key in (noise, bytes(der), bytes(der[: where % len(der)])):
        got = rsa_numbers(key)
        assert isinstance(got, tuple) or got in (errno.EBADMSG, errno.EINVAL, errno.ENOMEM)


def test_rsa_public_key_errnos_are_rsa_helpers() -> None:
    """Empty n or e, and e longer than n, are EINVAL; a DER fault is EBADMSG."""

    def seq(*ints: bytes) -> bytes:
        body = b"".join(b"\x02" + bytes([len(i)]) + i for i in ints)
        return b"\x30" + bytes([len(body)]) + body

    assert rsa_numbers(seq(b"", b"\x03")) == errno.EINVAL
    assert rsa_numbers(seq(b"\x0b", b"")) == errno.EINVAL
    assert rsa_numbers(seq(b"\x0b", b"\x01\x00")) == errno.EINVAL
    assert rsa_numbers(seq(b"\xf1", b"\x03")) == (0xF1, 3)  # unsigned, as mpi_read_raw_data
    assert rsa_numbers(b"\x31\x00") == errno.EBADMSG

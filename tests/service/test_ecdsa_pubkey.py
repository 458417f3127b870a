"""ECDSA signature values are read as crypto/ecdsa.c reads them (Linux 6.1).

``ecdsa_verify`` decodes the signature with the kernel's ``ecdsasignature.asn1`` grammar and
``ecdsa_get_signature_rs``: each INTEGER is an unsigned number of the curve's size, one extra
leading zero byte allowed. These tests pin the errno of each refusal and show that the
numbers, not their DER spelling, are what cryptography is handed to verify.
"""

from __future__ import annotations

import errno
import functools
import hashlib

from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, utils
from hypothesis import given
from hypothesis import strategies as st

from service.verify.signature.pubkey import PublicKey, SigParams, ecdsa_rs, verify_signature

P256 = 32  # bytes in a P-256 number
P256_ORDER = 0xFFFFFFFF00000000FFFFFFFFFFFFFFFFBCE6FAADA7179E84F3B9CAC2FC632551


def tlv(tag: int, content: bytes) -> bytes:
    """DER tag, short-form length, content."""
    assert len(content) < 0x80
    return bytes([tag, len(content)]) + content


def sig_value(r: bytes, s: bytes) -> bytes:
    """An ECDSA-Sig-Value whose INTEGERs have exactly these content octets."""
    return tlv(0x30, tlv(0x02, r) + tlv(0x02, s))


def num(n: int, size: int = P256) -> bytes:
    """``n`` as ``size`` unsigned big-endian bytes."""
    return n.to_bytes(size, "big")


@functools.cache
def p256_key() -> ec.EllipticCurvePrivateKey:
    """One P-256 key for the whole module."""
    return ec.generate_private_key(ec.SECP256R1())


def public(key: ec.EllipticCurvePrivateKey) -> PublicKey:
    """The key as the kernel holds it: the uncompressed point."""
    point = key.public_key().public_bytes(
        serialization.Encoding.X962, serialization.PublicFormat.UncompressedPoint
    )
    return PublicKey("ecdsa-nist-p256", point)


def signed(message: bytes, *, high_r: bool) -> tuple[int, int, bytes]:
    """(r, s, digest) of a SHA-256 signature of ``message``-and-a-counter whose r has (or
    lacks) its top bit set, so DER needs (or does not need) a sign byte in front of r."""
    for counter in range(1000):
        digest = hashlib.sha256(message + counter.to_bytes(2, "big")).digest()
        der = p256_key().sign(digest, ec.ECDSA(utils.Prehashed(hashes.SHA256())))
        r, s = utils.decode_dss_signature(der)
        if (r.bit_length() == 256) == high_r:
            return r, s, digest
    raise AssertionError("no signature with the wanted r in 1000 tries")


def verify(value: bytes, digest: bytes) -> int:
    """The errno ``public_key_verify_signature`` gives this value and digest (0 accepts)."""
    sig = SigParams("ecdsa", "x962", "sha256", value, digest)
    return verify_signature(public(p256_key()), sig, have_ecdsa=True)


@given(
    st.sampled_from((24, 32, 48)),
    st.integers(min_value=1, max_value=2**384 - 1),
    st.integers(min_value=1, max_value=2**384 - 1),
)
def test_der_numbers_that_fit_the_curve_read_back_and_others_are_einval(
    size: int, r: int, s: int
) -> None:
    """Any DER (r, s) reads back as the same numbers when both fit ``size`` bytes, and is
    EINVAL when one does not (cryptography writes the DER, with its sign bytes)."""
    fits = max(r, s) < 2 ** (8 * size)
    assert ecdsa_rs(utils.encode_dss_signature(r, s), size) == ((r, s) if fits else errno.EINVAL)


def test_a_sign_byte_in_front_of_r_is_skipped() -> None:
    """A 33-byte r whose first byte is the zero sign byte is the 32-byte number after it."""
    r = 0x80 << 248 | 5
    assert ecdsa_rs(sig_value(b"\x00" + num(r), b"\x07"), P256) == (r, 7)


def test_numbers_shorter_than_the_curve_are_zero_extended() -> None:
    """A short INTEGER is the same number (the kernel pads it with leading zeros)."""
    assert ecdsa_rs(sig_value(b"\x01", b"\x00\x02"), P256) == (1, 2)


def test_integers_are_read_unsigned() -> None:
    """A 32-byte r with its top bit set (negative in DER) is read as a positive number."""
    assert ecdsa_rs(sig_value(b"\xff" * 32, b"\x01"), P256) == (2**256 - 1, 1)


def test_an_r_longer_than_the_curve_is_einval() -> None:
    """More than one extra byte, or one extra byte that is not zero, is EINVAL."""
    assert ecdsa_rs(sig_value(b"\x00\x00" + num(1), b"\x01"), P256) == errno.EINVAL
    assert ecdsa_rs(sig_value(b"\x01" + num(1), b"\x01"), P256) == errno.EINVAL
    assert ecdsa_rs(sig_value(b"\x01", b"\x01" + num(1)), P256) == errno.EINVAL


def test_an_empty_integer_is_einval() -> None:
    """An INTEGER with no content octets is EINVAL (``!vlen``)."""
    assert ecdsa_rs(sig_value(b"", b"\x01"), P256) == errno.EINVAL
    assert ecdsa_rs(sig_value(b"\x01", b""), P256) == errno.EINVAL


def test_a_wrong_tag_is_ebadmsg() -> None:
    """A BIT STRING where r belongs, or a SET for the SEQUENCE, is the decoder's EBADMSG."""
    assert ecdsa_rs(tlv(0x30, tlv(0x03, b"\x01") + tlv(0x02, b"\x01")), P256) == errno.EBADMSG
    assert ecdsa_rs(tlv(0x31, tlv(0x02, b"\x01") + tlv(0x02, b"\x01")), P256) == errno.EBADMSG


def test_trailing_bytes_inside_the_sequence_are_ebadmsg() -> None:
    """A third element inside the SEQUENCE, or a missing s, is EBADMSG."""
    inside = tlv(0x30, tlv(0x02, b"\x01") + tlv(0x02, b"\x02") + tlv(0x02, b"\x03"))
    assert ecdsa_rs(inside, P256) == errno.EBADMSG
    assert ecdsa_rs(tlv(0x30, tlv(0x02, b"\x01")), P256) == errno.EBADMSG
    assert ecdsa_rs(b"", P256) == errno.EBADMSG


def test_trailing_bytes_after_the_sequence_are_ignored() -> None:
    """Bytes after the ECDSA-Sig-Value are not read: the value still verifies."""
    r, s, digest = signed(b"trailing", high_r=False)
    value = utils.encode_dss_signature(r, s)
    assert ecdsa_rs(value + b"\x00\xff", P256) == (r, s)
    assert verify(value + b"\x00\xff", digest) == 0


def test_a_negative_looking_r_verifies_as_the_kernel_reads_it() -> None:
    """r with its top bit set and no sign byte (not DER) verifies: the kernel reads it
    unsigned, and cryptography is handed the number, not the spelling."""
    r, s, digest = signed(b"unsigned", high_r=True)
    assert verify(utils.encode_dss_signature(r, s), digest) == 0
    assert verify(sig_value(num(r), num(s)), digest) == 0
    assert verify(sig_value(num(r), num(s ^ 1)), digest) == errno.EKEYREJECTED


def test_r_or_s_out_of_range_is_ebadmsg() -> None:
    """0 or a number not below the group order is EBADMSG (``_ecdsa_verify``), not a
    mismatch."""
    r, s, digest = signed(b"range", high_r=False)
    for bad in ((0, s), (r, 0), (P256_ORDER, s), (r, P256_ORDER + 1)):
        assert verify(sig_value(num(bad[0]), num(bad[1])), digest) == errno.EBADMSG, bad


def test_a_compressed_point_is_einval() -> None:
    """``ecdsa_set_pub_key`` takes only uncompressed points: a compressed key is EINVAL."""
    r, s, digest = signed(b"compressed", high_r=False)
    point = (
        p256_key()
        .public_key()
        .public_bytes(serialization.Encoding.X962, serialization.PublicFormat.CompressedPoint)
    )
    sig = SigParams("ecdsa", "x962", "sha256", utils.encode_dss_signature(r, s), digest)
    pub = PublicKey("ecdsa-nist-p256", point)
    assert verify_signature(pub, sig, have_ecdsa=True) == errno.EINVAL

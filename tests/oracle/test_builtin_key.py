"""Patching the built-in certificate slot of a kernel image (no VM)."""

from __future__ import annotations

import datetime as dt

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import rsa
from cryptography.x509.oid import NameOID

from tests.vm.harness.builtin_key import DEBIAN_KEY_CN, find_builtin_cert, patch_builtin_cert
from tests.vm.harness.errors import VmSetupError


def _cert(cn: str, bits: int) -> bytes:
    key = rsa.generate_private_key(public_exponent=65537, key_size=bits)
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, cn)])
    when = dt.datetime(2024, 1, 1, tzinfo=dt.UTC)
    cert = (
        x509.CertificateBuilder().subject_name(name).issuer_name(name)
        .public_key(key.public_key()).serial_number(7)
        .not_valid_before(when).not_valid_after(when + dt.timedelta(days=1))
        .sign(key, hashes.SHA256())
    )  # fmt: skip
    return cert.public_bytes(serialization.Encoding.DER)


def test_patch_replaces_the_certificate_and_pads_with_zeros() -> None:
    """The Debian certificate is found by its CN, replaced by the test one, zero padded to
    the same length; everything around it is unchanged."""
    debian = _cert(DEBIAN_KEY_CN.decode(), 2048)
    image = b"\x30\x82junk" * 100 + debian + b"\x00\x00\x05\x2c" + b"tail" * 10
    assert find_builtin_cert(image) == (600, len(debian))
    test = _cert("test", 1024)
    patched = patch_builtin_cert(image, test)
    assert len(patched) == len(image)
    assert patched[:600] == image[:600]
    assert patched[600 : 600 + len(test)] == test
    assert patched[600 + len(test) : 600 + len(debian)] == b"\0" * (len(debian) - len(test))
    assert patched[600 + len(debian) :] == image[600 + len(debian) :]


def test_patch_refuses_a_certificate_larger_than_the_slot() -> None:
    """A test certificate that does not fit is an error, not a corrupted kernel."""
    image = b"pad" + _cert(DEBIAN_KEY_CN.decode(), 1024) + b"pad"
    with pytest.raises(VmSetupError, match="slot"):
        patch_builtin_cert(image, _cert("big", 4096))

"""Signing keys made with openssl and signatures made with the kernel's own tools.

:func:`sign` runs kbuild's ``scripts/sign-file``, the exact producer the kernel expects;
:func:`cms_sign` uses ``openssl cms`` for variants sign-file refuses to make (signed
attributes, SHA-1). :func:`debian_build_cert` pulls Debian's ephemeral build-time signing
certificate out of the compressed kernel image.
"""

from __future__ import annotations

import gzip
import io
import lzma
import os
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509

from tests.kmod.build import cache_root, kernel_release
from tests.kmod.forge import append_signature

SIGN_FILE = Path("/usr/lib/linux-kbuild-6.1/scripts/sign-file")
KINDS = {
    "rsa4096": ["-newkey", "rsa:4096"],
    "rsa2048": ["-newkey", "rsa:2048"],
    "p384": ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:secp384r1"],
    "p256": ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1"],
}
# The extensions of the kernel's certs/default_x509.genkey.
_GENKEY = """\
[ req ]
distinguished_name = dn
prompt = no
string_mask = utf8only
x509_extensions = myexts
[ dn ]
CN = {cn}
[ myexts ]
basicConstraints = critical,CA:FALSE
keyUsage = digitalSignature
subjectKeyIdentifier = hash
authorityKeyIdentifier = keyid
"""


@dataclass(frozen=True)
class SigningKey:
    """A private key (PEM) and its self-signed certificate in PEM and DER."""

    key: Path
    cert_pem: Path
    cert_der: Path
    kind: str


def _run(argv: list[str]) -> None:
    proc = subprocess.run(argv, capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        raise RuntimeError(f"{argv[0]} failed ({proc.returncode}): {proc.stderr.strip()}")


def make_key(
    directory: Path,
    kind: str = "rsa4096",
    *,
    cn: str = "modstage test key",
    serial: int | None = None,
) -> SigningKey:
    """A new module signing key of ``kind`` (rsa4096, rsa2048, p384, p256) in ``directory``.

    ``serial`` pins the certificate serial number, so a test can forge a certificate with
    the same issuer and serial as another one but a different key.
    """
    directory.mkdir(parents=True, exist_ok=True)
    stem = directory / f"{kind}-{cn.replace(' ', '_')}-{serial or 'r'}"
    config = stem.with_suffix(".genkey")
    config.write_text(_GENKEY.format(cn=cn))
    key = SigningKey(
        stem.with_suffix(".key"), stem.with_suffix(".pem"), stem.with_suffix(".der"), kind
    )
    argv = ["openssl", "req", "-new", "-nodes", "-utf8", "-x509", "-days", "3650", "-batch"]
    argv += ["-config", str(config), "-sha256", *KINDS[kind]]
    argv += ["-keyout", str(key.key), "-out", str(key.cert_pem)]
    if serial is not None:
        argv += ["-set_serial", str(serial)]
    _run(argv)
    _run(
        ["openssl", "x509", "-in", str(key.cert_pem), "-outform", "DER", "-out", str(key.cert_der)]
    )
    return key


def sign(
    module: Path, key: SigningKey, out: Path, *, hash: str = "sha256", skid: bool = False
) -> Path:
    """Copy ``module`` to ``out`` and sign the copy with kbuild's ``sign-file`` (``-k``: SKID)."""
    shutil.copyfile(module, out)
    argv = [str(SIGN_FILE), *(["-k"] if skid else []), hash, str(key.key), str(key.cert_pem)]
    _run([*argv, str(out)])
    return out


def cms_sign(
    module: Path,
    key: SigningKey,
    out: Path,
    *,
    hash: str = "sha256",
    attributes: bool = True,
    detached: bool = True,
) -> Path:
    """Sign with ``openssl cms`` (no certs); ``attributes`` keeps signed attributes,
    ``detached=False`` embeds the module in the PKCS#7 message."""
    blob = out.with_suffix(out.suffix + ".p7s")
    argv = ["openssl", "cms", "-sign", "-binary", "-nocerts", "-outform", "DER", "-md", hash]
    argv += ["-in", str(module), "-signer", str(key.cert_pem), "-inkey", str(key.key)]
    argv += [] if attributes else ["-noattr"]
    _run([*argv, *([] if detached else ["-nodetach"]), "-out", str(blob)])
    out.write_bytes(append_signature(module.read_bytes(), blob.read_bytes()))
    return out


_MAGICS = ((b"\xfd7zXZ\x00", "xz"), (b"\x1f\x8b\x08\x00", "gzip"))


def _decompressed_kernel(image: bytes) -> bytes:
    for magic, kind in _MAGICS:
        start = image.find(magic)
        if start < 0:
            continue
        if kind == "xz":
            return lzma.LZMADecompressor().decompress(image[start:])
        return gzip.GzipFile(fileobj=io.BytesIO(image[start:])).read()
    raise RuntimeError("no xz or gzip payload in the kernel image")


def _find_cert(kernel: bytes, cn: bytes) -> bytes:
    at = kernel.find(cn)
    while at >= 0:
        for start in range(at, max(at - 4096, 0), -1):
            if kernel[start : start + 2] != b"\x30\x82":
                continue
            end = start + 4 + int.from_bytes(kernel[start + 2 : start + 4], "big")
            try:
                x509.load_der_x509_certificate(kernel[start:end])
            except ValueError:
                continue
            return kernel[start:end]
        at = kernel.find(cn, at + 1)
    raise RuntimeError(f"no certificate with {cn!r} in the kernel image")


def debian_build_cert() -> bytes:
    """DER of Debian's build-time module signing certificate, read from ``/boot/vmlinuz-*``."""
    release = kernel_release()
    cached = cache_root() / f"debian-build-cert-{release}.der"
    if cached.is_file():
        return cached.read_bytes()
    kernel = _decompressed_kernel(Path(f"/boot/vmlinuz-{release}").read_bytes())
    der = _find_cert(kernel, b"Build time autogenerated kernel key")
    tmp = cached.with_suffix(f".{os.getpid()}.tmp")
    tmp.write_bytes(der)
    tmp.replace(cached)
    return der

"""Trusted module-signing certificates, looked up by the kernel's key ids.

The kernel finds a module's signer in its keyring by an exact byte comparison of key
ids: ``serial || issuer`` (the raw content octets of the certificate's serial INTEGER
and issuer Name, no DN normalisation) for SignerInfo v1, and the raw
subjectKeyIdentifier for v3. :class:`TrustStore` indexes certificates the same way.

Validity dates are ignored, as the kernel ignores them for module signatures: an expired
or not-yet-valid certificate still verifies. Mirroring this keeps modstage's verdict equal
to the kernel's; the kernel's keyrings, not a clock, decide what is trusted.
"""

from __future__ import annotations

import base64
import os
import re
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import NamedTuple

from service.errors import TrustError
from service.logs import get_logger
from service.verify.signature.asn1 import Asn1Error
from service.verify.signature.pubkey import rsa_numbers
from service.verify.signature.signers import KernelKey, KeySet
from service.verify.signature.x509 import Cert, parse_certificate
from service.verify.targetkernel.rules import KernelRules

log = get_logger("modstage.trust")

SUFFIXES = (".pem", ".der", ".crt", ".cer")
MAX_CERT_FILE = 1 << 20
_PEM = re.compile(rb"-----BEGIN CERTIFICATE-----\s+(.+?)\s+-----END CERTIFICATE-----", re.S)


class TrustedKey(NamedTuple):
    """A certificate's public key with the key ids the kernel would file it under."""

    source: str
    subject: str  # the subject's commonName, or the whole subject when it has none
    key_ids: tuple[bytes, ...]
    der: bytes = b""

    @classmethod
    def from_der(cls, der: bytes, source: str) -> TrustedKey:
        """Parse one DER certificate as the kernel does
        (:func:`~service.verify.signature.x509.parse_certificate`, the parser verification
        also runs over a signature's certificates); raises :class:`TrustError`.

        The key ids are the kernel's own (``serial || issuer``, the subjectKeyIdentifier);
        a certificate the kernel could not load with every feature enabled (an unknown
        key algorithm or curve, a malformed RSA key) is not usable. Which target can load
        it is decided per target by :meth:`TrustStore.kernel_keys`.
        """
        try:  # no digest: whether its self-signature verifies is a target's question
            cert = _parsed_by_some_kernel(der)
        except Asn1Error as exc:
            raise TrustError(source, f"not a usable X.509 certificate: {exc}") from exc
        pub = cert.pub
        if pub is None:
            raise TrustError(source, "not a usable X.509 certificate: no public key")
        if pub.algo == "rsa" and isinstance(why := rsa_numbers(pub.key), int):
            raise TrustError(
                source, f"not a usable X.509 certificate: RSA key ({os.strerror(why)})"
            )
        key_ids = [cert.id] + ([cert.skid] if cert.skid is not None else [])
        return cls(source, cert.subject, tuple(key_ids), der)


def _parsed_by_some_kernel(der: bytes) -> Cert:
    """The certificate as the newest kernel known parses it, else as the oldest does (an
    SM2 key); the error of the newer parser when neither can."""
    try:
        return parse_certificate(der, rules=KernelRules.newest())
    except Asn1Error as newer:
        try:
            return parse_certificate(der, rules=KernelRules.oldest())
        except Asn1Error:
            raise newer from None


def _der_sequence(data: bytes, at: int, source: str) -> int:
    """End offset of the DER SEQUENCE starting at ``at``."""
    if at + 2 > len(data) or data[at] != 0x30:
        raise TrustError(source, f"no DER certificate at byte {at}")
    first = data[at + 1]
    if first < 0x80:
        return at + 2 + first
    count = first & 0x7F
    if count == 0 or count > 4 or at + 2 + count > len(data):
        raise TrustError(source, f"bad DER length at byte {at}")
    return at + 2 + count + int.from_bytes(data[at + 2 : at + 2 + count], "big")


def split_certificates(data: bytes, source: str) -> Iterator[bytes]:
    """Each DER certificate in ``data``: PEM blocks, or one or more concatenated DER."""
    if b"-----BEGIN" in data:
        blocks = _PEM.findall(data)
        if not blocks:
            raise TrustError(source, "PEM file without a CERTIFICATE block")
        for block in blocks:
            try:
                yield base64.b64decode(b"".join(block.split()), validate=True)
            except ValueError as exc:
                raise TrustError(source, f"bad base64 in a PEM block: {exc}") from exc
        return
    at = 0
    while at < len(data):
        end = _der_sequence(data, at, source)
        if end > len(data):
            raise TrustError(source, f"DER certificate at byte {at} is truncated")
        yield data[at:end]
        at = end
    if not data:
        raise TrustError(source, "empty certificate file")


class TrustStore:
    """Trusted keys by kernel key id; a key id filed twice is a configuration error."""

    def __init__(self, keys: Iterable[TrustedKey] = ()) -> None:
        self.keys = tuple(keys)
        self._by_id: dict[bytes, TrustedKey] = {}
        self._kernel: dict[KernelRules, tuple[KeySet, tuple[str, ...]]] = {}
        for key in self.keys:
            for key_id in key.key_ids:
                other = self._by_id.setdefault(key_id, key)
                if other is not key:
                    raise TrustError(
                        key.source, f"key id {key_id.hex()} is also filed by {other.source}"
                    )

    @classmethod
    def from_der(cls, *certificates: bytes) -> TrustStore:
        """A store holding the given DER certificates."""
        return cls(
            TrustedKey.from_der(der, f"<certificate {i}>") for i, der in enumerate(certificates)
        )

    @classmethod
    def from_directory(cls, directory: Path, *, strict: bool = False) -> TrustStore:
        """Every certificate in ``directory``'s ``*.pem/*.der/*.crt/*.cer`` regular files.

        A file that holds no usable certificate (empty, a private key, garbage, too
        large, unreadable) and a certificate whose key id an earlier file already
        files (a duplicate) are skipped with a logged reason: a stray file must not
        cost a node its drivers. Only an unlistable directory is an error, unless
        ``strict`` (a configuration check): then each of those is a :class:`TrustError`.
        """
        try:
            entries = sorted(p for p in directory.iterdir() if p.suffix.lower() in SUFFIXES)
        except OSError as exc:
            raise TrustError(
                directory, f"cannot list trusted certificates: {exc.strerror}"
            ) from exc
        keys: list[TrustedKey] = []
        filed: dict[bytes, TrustedKey] = {}
        for path in entries:
            if not path.is_file():
                continue  # the directory is admin-owned: symlinks to certificates are fine
            try:
                found = _certificates(path)
            except TrustError as exc:
                if strict:
                    raise
                log.warning("trust.skipped", path=str(path), reason=exc.reason)
                continue
            for key in found:
                other = next((filed[k] for k in key.key_ids if k in filed), None)
                if other is not None and strict:
                    raise TrustError(key.source, f"key id is also filed by {other.source}")
                if other is not None:
                    why = f"duplicate: its key id is already filed by {other.source}"
                    log.warning("trust.skipped", path=str(path), reason=why)
                    continue
                keys.append(key)
                filed.update(dict.fromkeys(key.key_ids, key))
        return cls(keys)

    def find(self, key_id: bytes) -> TrustedKey | None:
        """The trusted key the kernel would find for ``key_id``, if any."""
        return self._by_id.get(key_id)

    def kernel_keys(self, rules: KernelRules) -> tuple[KeySet, tuple[str, ...]]:
        """The keyring a target kernel would build from these certificates, and what it drops.

        Each certificate goes through the kernel's own X.509 parse for that target's
        ``rules``: one
        it cannot load (an EC key without ``CONFIG_CRYPTO_ECDSA``, a self-signed RSA key
        of a size the kernel's RSA refuses, a malformed extension) is left out, as the
        kernel leaves it out of its keyring, and named in the second element.
        """
        cached = self._kernel.get(rules)
        if cached is None:
            loaded, dropped = [], []
            for key in self.keys:
                try:
                    cert = parse_certificate(key.der, rules=rules)
                except Asn1Error as exc:
                    dropped.append(f"{key.source} ({key.subject}): {exc}")
                    continue
                if cert.pub is not None:
                    loaded.append(KernelKey(cert.id, cert.skid, cert.pub, key.subject, key.source))
            cached = self._kernel[rules] = (KeySet(loaded), tuple(dropped))
        return cached


def _certificates(path: Path) -> list[TrustedKey]:
    """The certificates of one file; raises :class:`TrustError` naming it."""
    try:
        with path.open("rb") as f:
            data = f.read(MAX_CERT_FILE + 1)
    except OSError as exc:
        raise TrustError(path, f"cannot read: {exc.strerror}") from exc
    if len(data) > MAX_CERT_FILE:
        raise TrustError(path, f"larger than {MAX_CERT_FILE} bytes")
    return [TrustedKey.from_der(der, str(path)) for der in split_certificates(data, str(path))]

"""``verify_pkcs7_message_sig`` for a module (certs/system_keyring.c, pkcs7_verify/trust.c).

Given a parsed message, the digests of the signed bytes and the trusted keys, decide as
Linux 6.1 does: detached data only; ``pkcs7_verify`` (module usage: content type data,
no signed attributes; each signer verified against an embedded certificate matching its
issuer+serial, then the embedded chain above it); then ``pkcs7_validate_trust`` against
the keyring: a chain from the signer up to a trusted key, the last certificate's
authority, or the signer's id directly. Any signer whose found key fails is
``EKEYREJECTED``, whatever the order of signers; one verified signer suffices; none
found is ``ENOKEY``.
"""

from __future__ import annotations

import errno
from collections.abc import Mapping, Sequence
from typing import NamedTuple

from service.verify.signature.pkcs7 import Message, SignerInfo
from service.verify.signature.pubkey import PublicKey, SigParams, verify_signature
from service.verify.signature.x509 import Cert


class KernelKey(NamedTuple):
    """A key as it sits in a kernel keyring: its two ids and its public key."""

    id: bytes  # serial || issuer
    skid: bytes | None
    pub: PublicKey
    subject: str
    source: str


class Refused(Exception):
    """The kernel's verdict was an errno; ``why`` says which rule."""

    def __init__(self, code: int, why: str) -> None:
        self.code, self.why = code, why
        super().__init__(why)


class Trusted(NamedTuple):
    """The signer that verified, and the key that vouched for it."""

    signer: SignerInfo
    key: KernelKey


class KeySet:
    """Keys by the kernel's ``ex:`` ids (``find_asymmetric_key``)."""

    def __init__(self, keys: Sequence[KernelKey]) -> None:
        self.keys = tuple(keys)

    def find(self, id_0: bytes | None, id_1: bytes | None) -> KernelKey:
        """The key matching ``id_0`` (else ``id_1``); raises :class:`Refused` (ENOKEY...)."""
        want = id_0 if id_0 is not None else id_1
        if not want:  # "ex:" with no hex: asymmetric_key_hex_to_key_id says EINVAL
            raise Refused(errno.EINVAL, "signer's key id is empty (identifier of the wrong kind)")
        for key in self.keys:
            if want is not None and want in (key.id, key.skid):
                if id_0 is not None and id_1 is not None and key.skid != id_1:
                    raise Refused(errno.EKEYREJECTED, "trusted key's SKID differs from the AKID")
                return key
        raise Refused(errno.ENOKEY, f"no trusted certificate has key id {(want or b'').hex()}")


def _sig(sinfo: SignerInfo, digests: Mapping[str, bytes]) -> SigParams:
    return SigParams(
        sinfo.pkey_algo,
        sinfo.encoding,
        sinfo.hash_algo,
        sinfo.signature,
        digests.get(sinfo.hash_algo or "", b""),
    )


def _chain(msg: Message, sinfo: SignerInfo, have_ecdsa: bool) -> int:
    """``pkcs7_verify_sig_chain``: link the signer's certificate to its embedded issuers."""
    for cert in msg.certs:
        cert.seen = False
    x509 = sinfo.signer
    while x509 is not None and x509.sig is not None:
        x509.seen = True
        if x509.self_signed:
            x509.signer = x509
            return 0
        kid0, kid1 = x509.auth_ids
        issuer: Cert | None = None
        if kid0 is not None:
            issuer = next((p for p in msg.certs if p.id == kid0), None)
            if issuer is not None and kid1 is not None and issuer.skid != kid1:
                return errno.EKEYREJECTED
        elif kid1 is not None:
            issuer = next((p for p in msg.certs if p.skid is not None and p.skid == kid1), None)
        if issuer is None or issuer.seen or issuer.pub is None:
            return 0
        code = verify_signature(issuer.pub, x509.sig, have_ecdsa=have_ecdsa)
        if code:
            return code
        x509.signer = issuer
        if x509 is issuer:
            return 0
        x509 = issuer
    return 0


def pkcs7_verify(msg: Message, digests: Mapping[str, bytes], have_ecdsa: bool) -> None:
    """The module-usage part of ``pkcs7_verify``; raises :class:`Refused`."""
    if msg.data_type != "data":
        raise Refused(errno.EKEYREJECTED, "module signature content is not pkcs7-data")
    if msg.have_authattrs:
        raise Refused(errno.EKEYREJECTED, "module signature has signed attributes")
    verified = False
    for sinfo in msg.signers:
        code = 0
        if sinfo.hash_algo not in digests:
            code = errno.ENOPKG
        else:
            sinfo.signer = next((c for c in msg.certs if c.id == sinfo.auth_id), None)
            if sinfo.signer is not None and sinfo.signer.pub is not None:
                code = verify_signature(
                    sinfo.signer.pub, _sig(sinfo, digests), have_ecdsa=have_ecdsa
                )
                if not code:
                    code = _chain(msg, sinfo, have_ecdsa)
        if code == errno.ENOPKG:
            sinfo.unsupported_crypto = True
            continue
        if code:
            what = f"signer {sinfo.index} against its embedded certificate"
            raise Refused(code, f"{what} ({sinfo.signer.subject if sinfo.signer else '?'})")
        verified = True
    if not verified:
        raise Refused(errno.ENOPKG, "no signer's digest algorithm is available in the target")


def _trust_one(
    sinfo: SignerInfo, keyring: KeySet, digests: Mapping[str, bytes], ecdsa: bool
) -> KernelKey:
    """``pkcs7_validate_trust_one``; returns the key that verified, raises :class:`Refused`."""
    if sinfo.unsupported_crypto:
        raise Refused(errno.ENOPKG, f"signer {sinfo.index}: digest not available in the target")
    sig = _sig(sinfo, digests)
    x509, last = sinfo.signer, None
    key: KernelKey | None = None
    while x509 is not None:
        if x509.seen:
            if x509.verified:
                return KernelKey(
                    x509.id, x509.skid, x509.pub or PublicKey("", b""), x509.subject, "embedded"
                )
            raise Refused(errno.ENOKEY, f"signer {sinfo.index}: chain already found untrusted")
        x509.seen = True
        try:
            key = keyring.find(x509.id, x509.skid)
            break
        except Refused:
            pass
        if x509.signer is x509:
            raise Refused(errno.ENOKEY, f"signer {sinfo.index}: unknown self-signed certificate")
        last = x509
        sig = last.sig or sig
        x509 = x509.signer
    if key is None and last is not None and (last.auth_ids[0] or last.auth_ids[1]):
        try:
            key, x509 = keyring.find(last.auth_ids[0], last.auth_ids[1]), last
        except Refused as exc:
            if exc.code != errno.ENOKEY:
                raise
    if key is None:
        x509, sig = None, _sig(sinfo, digests)
        key = keyring.find(sinfo.auth_id, None)
    if verify_signature(key.pub, sig, have_ecdsa=ecdsa):
        raise Refused(
            errno.EKEYREJECTED, f"signature does not match the module (key {key.subject!r})"
        )
    if x509 is not None:
        x509.verified = True
        p = sinfo.signer
        while p is not None and p is not x509:
            p.verified = True
            p = p.signer
    return key


def validate_trust(
    msg: Message, keyring: KeySet, digests: Mapping[str, bytes], ecdsa: bool
) -> Trusted:
    """``pkcs7_validate_trust``: EKEYREJECTED > verified > ENOPKG > ENOKEY."""
    for cert in msg.certs:
        cert.seen = False
    best: Trusted | None = None
    cached = Refused(errno.ENOKEY, "no signer's key is trusted")
    for sinfo in msg.signers:
        try:
            key = _trust_one(sinfo, keyring, digests, ecdsa)
        except Refused as exc:
            if exc.code == errno.ENOKEY:
                if cached.code == errno.ENOKEY and len(msg.signers) == 1:
                    cached = exc
                continue
            if exc.code == errno.ENOPKG:
                if cached.code == errno.ENOKEY:
                    cached = exc
                continue
            raise
        best = best or Trusted(sinfo, key)
    if best is None:
        raise cached
    return best

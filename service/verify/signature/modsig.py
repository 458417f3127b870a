"""The appended signature of a module, as ``module_sig_check`` judges it (Linux 6.1).

:func:`read_signature` checks the trailer and parses the PKCS#7 blob;
:func:`check_signers` runs ``verify_pkcs7_message_sig`` against the trusted keys the
target kernel would hold, then modstage's own digest policy. Both report in the
kernel's words (an errno first) for :mod:`service.verify.verdict`.
"""

from __future__ import annotations

import errno
from typing import BinaryIO, NamedTuple

from service.errors import ModuleRejected, Refusal
from service.verify.signature.asn1 import MAX_BLOB, Asn1Error
from service.verify.signature.pkcs7 import Message, MlDsaSignature, parse_message
from service.verify.signature.signers import Refused, pkcs7_verify, validate_trust
from service.verify.signature.trailer import TAIL, parse_trailer
from service.verify.signature.trust import TrustStore
from service.verify.targetkernel.kernel import Target

_WEAK_DIGESTS = ("md4", "md5", "sha1", "sm3", "streebog256", "streebog512")


def read_at(f: BinaryIO, at: int, n: int) -> bytes:
    """``n`` bytes of ``f`` from offset ``at``."""
    f.seek(at)
    return f.read(n)


def errno_name(code: int) -> str:
    """``EKEYREJECTED`` for its number (``errno N`` when it has no name)."""
    return errno.errorcode.get(code, f"errno {code}")


class Signed(NamedTuple):
    """Who signed a module, as far as the signature check got."""

    signer: str | None  # the trusted certificate's subject, once one verified
    hash: str | None
    key_id: str | None  # hex of the kernel's key id of the signer
    weak: str | None = None  # a digest modstage refuses as policy (md5, sha1, ...)


def first_signer(msg: Message) -> Signed:
    """What the message says of its first signer before anything is verified."""
    first = msg.signers[0]
    return Signed(None, first.hash_algo, first.auth_id.hex())


def check_signers(
    msg: Message, digests: dict[str, bytes], trust: TrustStore, target: Target
) -> Signed:
    """``verify_pkcs7_message_sig`` for a module, then modstage's digest policy
    (:func:`digest_policy`).

        Returns the trusted signer (see :func:`digest_policy`); raises
        :class:`ModuleRejected` (the caller still knows :func:`first_signer`).
    """
    if msg.has_data:
        raise ModuleRejected("EBADMSG", "PKCS#7 signature with non-detached data")
    keyring, dropped = trust.kernel_keys(target.rules)
    try:
        pkcs7_verify(msg, digests, target.rules.ecdsa)
        trusted = validate_trust(msg, keyring, digests, target.rules.ecdsa)
    except Refused as exc:
        why = exc.why
        if exc.code == errno.ENOKEY and dropped:
            why += "; trusted certificates the target kernel cannot load: " + "; ".join(dropped)
        raise ModuleRejected(errno_name(exc.code), why) from exc
    sinfo = trusted.signer
    weak = None
    if sinfo.hash_algo in _WEAK_DIGESTS or sinfo.pkey_oid == "id_ecdsa_with_sha1":
        weak = "ecdsa-with-SHA1" if sinfo.pkey_oid == "id_ecdsa_with_sha1" else sinfo.hash_algo
    return Signed(trusted.key.subject, sinfo.hash_algo, sinfo.auth_id.hex(), weak)


def digest_policy(signed: Signed) -> Refusal | None:
    """modstage's refusal of a weak digest the target kernel would still accept."""
    if signed.weak is None:
        return None
    return Refusal(
        "ENOPKG",
        f"{signed.weak} signatures are refused by modstage (the target kernel would accept "
        "this one)",
        policy=True,
    )


def ml_dsa_refusal(variant: str, target: Target) -> Refusal:
    """An ML-DSA signature on a target whose parsers name it (7.0 on): a kernel built with
    ``CONFIG_CRYPTO_MLDSA`` would verify it, so modstage, which verifies no ML-DSA, refuses it
    as its policy; without it the kernel has no verifier and refuses it (``EKEYREJECTED``
    under enforcement: Debian's 7.2)."""
    if target.rules.mldsa or not target.config.known:
        could = "built with" if target.config.known else "if built with"
        why = (f"{variant} signatures are not verified by modstage (the target kernel, {could} "
               "CONFIG_CRYPTO_MLDSA, would verify this one)")  # fmt: skip
        return Refusal("ENOPKG", why, policy=True)
    why = f"{variant} signature: the target kernel has no ML-DSA verifier (no CONFIG_CRYPTO_MLDSA)"
    return Refusal("ENOPKG", why)


def read_signature(
    f: BinaryIO, size: int, problems: list[Refusal], target: Target
) -> tuple[int, Message | None]:
    """Trailer and PKCS#7 parse: (signed length, the parsed message or None).

    A problem is appended to ``problems`` (the message is then None).
    """
    try:
        trailer = parse_trailer(read_at(f, max(0, size - TAIL), min(size, TAIL)), size)
    except ModuleRejected as exc:
        problems.append(exc.refusal)
        return size, None
    if trailer.sig_len > MAX_BLOB:
        problems.append(
            Refusal("EMSGSIZE", f"PKCS#7 blob of {trailer.sig_len} bytes (kernel max {MAX_BLOB})")
        )
        return trailer.signed_len, None
    try:
        msg = parse_message(
            read_at(f, trailer.signed_len, trailer.sig_len),
            rules=target.rules,
        )
    except MlDsaSignature as exc:
        problems.append(ml_dsa_refusal(exc.variant, target))
        return trailer.signed_len, None
    except Asn1Error as exc:
        what = "malformed PKCS#7: " if exc.code == errno.EBADMSG else ""
        problems.append(Refusal(errno_name(exc.code), f"{what}{exc.why}"))
        return trailer.signed_len, None
    return trailer.signed_len, msg

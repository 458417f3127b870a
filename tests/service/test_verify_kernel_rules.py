"""Divergences from Linux 6.1 found by reading its source, each as the kernel decides.

Signatures here are built with ``tests.kmod.pkcs7`` over a real test module: several
signers, embedded certificates and CRLs, BER encodings, key sizes and algorithms the
target cannot use.
"""

from __future__ import annotations

import datetime
import io
from pathlib import Path

import pytest
from asn1crypto import cms
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec

from service.verify.signature.trust import TrustStore
from service.verify.targetkernel.kernel import Target
from service.verify.targetkernel.rules import KernelRules
from service.verify.verdict import Verdict, verify_module
from tests.kmod import append_signature
from tests.kmod.pkcs7 import Cert, indefinite_around, make_cert, signed_data, signer_info


@pytest.fixture(scope="module")
def payload(modules: dict[str, Path]) -> bytes:
    """The unsigned test module the signatures cover."""
    return modules["ms_params"].read_bytes()


@pytest.fixture(scope="module")
def alice() -> Cert:
    """A trusted self-signed RSA-2048 key."""
    return make_cert("alice", serial=1)


@pytest.fixture(scope="module")
def bob() -> Cert:
    """A second trusted self-signed RSA-2048 key."""
    return make_cert("bob", serial=2)


@pytest.fixture(scope="module")
def mallory() -> Cert:
    """A key nobody trusts."""
    return make_cert("mallory", serial=3)


@pytest.fixture(scope="module")
def ca() -> Cert:
    """A trusted CA that signs leaf certificates."""
    return make_cert("test ca", ca=True, serial=10)


@pytest.fixture(scope="module")
def leaf(ca: Cert) -> Cert:
    """A leaf certificate issued by ``ca`` (not itself trusted)."""
    return make_cert("leaf", issuer=ca, serial=11)


def verdict(payload: bytes, blob: bytes, trust: TrustStore, target: Target) -> Verdict:
    module = append_signature(payload, blob)
    return verify_module(io.BytesIO(module), display="m.ko", trust=trust, kernel=target)


def test_every_signer_with_a_found_key_must_verify_whatever_the_order(
    payload: bytes, alice: Cert, bob: Cert, target: Target
) -> None:
    """pkcs7_validate_trust: a trusted signer that fails is EKEYREJECTED, before or after a good one."""
    trust = TrustStore.from_der(alice.der, bob.der)
    good = signer_info(payload, alice)
    bad = signer_info(payload + b"other bytes", bob)
    for order in ([good, bad], [bad, good]):
        v = verdict(payload, signed_data(order), trust, target)
        assert (v.ok, v.errno) == (False, "EKEYREJECTED"), v.reason
        assert v.reason is not None and "bob" in v.reason


def test_an_unknown_second_signer_is_skipped_one_verified_suffices(
    payload: bytes, alice: Cert, mallory: Cert, target: Target
) -> None:
    """A signer whose key is not found (ENOKEY) does not matter once another one verified."""
    trust = TrustStore.from_der(alice.der)
    blob = signed_data([signer_info(payload, mallory), signer_info(payload, alice)])
    v = verdict(payload, blob, trust, target)
    assert v.ok, v.reason
    assert v.signer == "alice"
    alone = verdict(payload, signed_data([signer_info(payload, mallory)]), trust, target)
    assert alone.reason is not None and alone.reason.startswith("ENOKEY")
    assert alone.errno == "EKEYREJECTED"  # what finit_module says under sig_enforce


def test_embedded_leaf_chained_to_a_trusted_ca_is_accepted(
    payload: bytes, ca: Cert, leaf: Cert, target: Target
) -> None:
    """pkcs7_validate_trust walks from the embedded signer certificate up to a trusted key."""
    trust = TrustStore.from_der(ca.der)
    with_leaf = signed_data([signer_info(payload, leaf)], certs=(leaf.der,))
    v = verdict(payload, with_leaf, trust, target)
    assert v.ok, v.reason
    assert v.signer == "test ca"
    without = verdict(payload, signed_data([signer_info(payload, leaf)]), trust, target)
    assert without.reason is not None and without.reason.startswith("ENOKEY")


def test_embedded_certificate_with_the_signers_id_but_another_key_fails_pkcs7_verify(
    payload: bytes, alice: Cert, target: Target
) -> None:
    """The embedded certificate matching issuer+serial is preferred: its key does not verify."""
    forged = make_cert("alice", serial=1)  # same issuer and serial as alice, another key
    trust = TrustStore.from_der(alice.der)
    blob = signed_data([signer_info(payload, alice)], certs=(forged.der,))
    v = verdict(payload, blob, trust, target)
    assert not v.ok and v.errno in ("EINVAL", "EBADMSG"), v.reason  # pkcs1pad's, as is
    assert v.reason is not None and "embedded certificate" in v.reason


def test_malformed_embedded_certificate_is_ebadmsg(
    payload: bytes, alice: Cert, target: Target
) -> None:
    """Every embedded certificate is parsed; one that is not X.509 fails the whole message."""
    info = cms.ContentInfo.load(signed_data([signer_info(payload, alice)], certs=(alice.der,)))
    blob = info.dump().replace(alice.der, b"\x30\x03\x02\x01\x05" + bytes(len(alice.der) - 5))
    v = verdict(payload, blob, TrustStore.from_der(alice.der), target)
    assert v.reason is not None and v.reason.startswith("EBADMSG: malformed PKCS#7: embedded")


def test_a_real_crl_is_ebadmsg_because_61_parses_crl_entries_as_certificates(
    payload: bytes, ca: Cert, alice: Cert, target: Target
) -> None:
    """pkcs7.asn1 defines CertificateList as SEQUENCE OF Certificate: a real CRL fails to parse."""
    crl = (
        x509.CertificateRevocationListBuilder()
        .issuer_name(x509.load_der_x509_certificate(ca.der).subject)
        .last_update(datetime.datetime(2024, 1, 1, tzinfo=datetime.UTC))
        .next_update(datetime.datetime(2025, 1, 1, tzinfo=datetime.UTC))
        .sign(ca.key, hashes.SHA256())  # type: ignore[arg-type]
    ).public_bytes(serialization.Encoding.DER)
    blob = signed_data([signer_info(payload, alice)], crls=(crl,))
    v = verdict(payload, blob, TrustStore.from_der(alice.der), target)
    assert v.reason is not None and v.reason.startswith("EBADMSG"), v.reason


def test_signer_infos_as_a_sequence_are_accepted(
    payload: bytes, alice: Cert, target: Target
) -> None:
    """SignerInfos ::= CHOICE { SET OF, SEQUENCE OF }: 6.1 takes both."""
    signer = signer_info(payload, alice)
    blob = signed_data([signer])
    set_der = cms.SignerInfos([signer]).dump()
    assert blob.count(set_der) == 1 and set_der[0] == 0x31
    as_sequence = blob.replace(set_der, b"\x30" + set_der[1:])
    v = verdict(payload, as_sequence, TrustStore.from_der(alice.der), target)
    assert v.ok, v.reason


def test_indefinite_length_issuer_name_is_accepted(
    payload: bytes, alice: Cert, target: Target
) -> None:
    """BER indefinite lengths on constructed types are fine for 6.1's decoder; the key id is
    the Name's content either way."""
    signer = signer_info(payload, alice)
    issuer = signer["sid"].chosen["issuer"].dump()
    blob = indefinite_around(signed_data([signer]), issuer)
    assert b"\x30\x80" in blob
    v = verdict(payload, blob, TrustStore.from_der(alice.der), target)
    assert v.ok, v.reason


def test_pkcs7_verify_refuses_what_a_module_signature_must_not_be(
    payload: bytes, alice: Cert
) -> None:
    """pkcs7_verify for VERIFYING_MODULE_SIGNATURE: content that is not pkcs7-data and
    signed attributes are EKEYREJECTED, a message none of whose digests the target has is
    ENOPKG, each named; the same message, unedited and with the digest, verifies."""
    import dataclasses
    import errno
    import hashlib

    from service.verify.signature.pkcs7 import Message, parse_message
    from service.verify.signature.signers import Refused, pkcs7_verify

    digests = {"sha256": hashlib.sha256(payload).digest()}

    def message(signer: cms.SignerInfo) -> Message:
        blob = signed_data([signer], certs=(alice.der,))
        return parse_message(
            blob, rules=KernelRules.parser((6, 1), frozenset(digests), ecdsa=False)
        )

    def refusal(msg: Message, given: dict[str, bytes] = digests) -> tuple[int, str]:
        with pytest.raises(Refused) as refused:
            pkcs7_verify(msg, given, False)
        return refused.value.code, refused.value.why

    plain = message(signer_info(payload, alice))
    pkcs7_verify(plain, digests, False)
    indirect = dataclasses.replace(plain, data_type="msIndirectData")
    assert refusal(indirect) == (errno.EKEYREJECTED, "module signature content is not pkcs7-data")
    attributed = signer_info(payload, alice)
    attributed["signed_attrs"] = cms.CMSAttributes(
        [
            cms.CMSAttribute({"type": "content_type", "values": ["data"]}),
            cms.CMSAttribute({"type": "message_digest", "values": [digests["sha256"]]}),
        ]
    )
    assert refusal(message(attributed)) == (
        errno.EKEYREJECTED,
        "module signature has signed attributes",
    )
    assert refusal(plain, {}) == (
        errno.ENOPKG,
        "no signer's digest algorithm is available in the target",
    )


def test_rsa_key_sizes_the_kernel_cannot_use_are_not_in_its_keyring(
    payload: bytes, target: Target
) -> None:
    """A self-signed RSA-3000 certificate fails the kernel's self-signature check (rsa.c allows
    512/1024/1536/2048/3072/4096 bits): it never enters a keyring, so its signer is ENOKEY."""
    odd = make_cert("odd size", bits=3000, serial=30)
    v = verdict(
        payload, signed_data([signer_info(payload, odd)]), TrustStore.from_der(odd.der), target
    )
    assert v.reason is not None and v.reason.startswith("ENOKEY"), v.reason
    assert "cannot load" in v.reason and "odd size" in v.reason


def test_only_a_missing_key_names_the_certificates_the_target_cannot_load(
    payload: bytes, alice: Cert, mallory: Cert, target: Target
) -> None:
    """The note naming trusted certificates the target cannot load explains ENOKEY alone,
    and only when there are such certificates: an unknown signer with every trusted
    certificate loadable is a plain ENOKEY, and a bad signature by a trusted key
    (EKEYREJECTED) says nothing of a certificate the target dropped."""
    odd = make_cert("odd size", bits=3000, serial=31)
    unknown = verdict(
        payload,
        signed_data([signer_info(payload, mallory)]),
        TrustStore.from_der(alice.der),
        target,
    )
    assert unknown.reason is not None and unknown.reason.startswith("ENOKEY"), unknown.reason
    assert "cannot load" not in unknown.reason
    bad = signed_data([signer_info(payload + b"other bytes", alice)])
    rejected = verdict(payload, bad, TrustStore.from_der(alice.der, odd.der), target)
    assert rejected.reason is not None and rejected.reason.startswith("EKEYREJECTED")
    assert "cannot load" not in rejected.reason and "odd size" not in rejected.reason


def test_a_refused_message_reports_its_first_signer(
    payload: bytes, mallory: Cert, bob: Cert, alice: Cert, target: Target
) -> None:
    """A message no signer of which verifies reports what its first SignerInfo (in the
    message's order, as the kernel's parser lists them) says: its digest and key id,
    whatever the others say. (DER sorts a SET OF, so which one is first is read back.)"""
    trust = TrustStore.from_der(alice.der)
    infos = [signer_info(payload, mallory), signer_info(payload, bob, hash="sha512")]
    blob = signed_data(infos)
    encoded = cms.ContentInfo.load(blob)["content"]["signer_infos"]
    order = [i["digest_algorithm"]["algorithm"].native for i in encoded]
    assert sorted(order) == ["sha256", "sha512"]
    first = infos[0] if order[0] == "sha256" else infos[1]
    alone = verdict(payload, signed_data([first]), trust, target)
    v = verdict(payload, blob, trust, target)
    assert v.reason is not None and v.reason.startswith("ENOKEY"), v.reason
    assert (v.hash, v.key_id) == (order[0], alone.key_id) and alone.key_id


def test_ec_keys_need_crypto_ecdsa_in_the_target(
    payload: bytes, target: Target, debian_target: Target
) -> None:
    """Debian's 6.1 has no CONFIG_CRYPTO_ECDSA: no EC certificate is in any keyring (ENOKEY);
    the same signature is fine for a target built with ECDSA."""
    p384 = make_cert("ec key", curve=ec.SECP384R1(), serial=40)
    blob = signed_data([signer_info(payload, p384, hash="sha384", skid=True)])
    trust = TrustStore.from_der(p384.der)
    assert verdict(payload, blob, trust, target).ok
    v = verdict(payload, blob, trust, debian_target)
    assert v.reason is not None and v.reason.startswith("ENOKEY") and "cannot load" in v.reason


def test_signer_identifier_of_the_wrong_kind_is_an_empty_key_id_einval(
    payload: bytes, alice: Cert, target: Target
) -> None:
    """A v1 SignerInfo carrying a SKID leaves serial+issuer empty: the keyring search for
    "ex:" with no hex fails with EINVAL (asymmetric_key_hex_to_key_id), fatal as it is."""
    signer = signer_info(payload, alice, skid=True)
    signer["version"] = "v1"
    v = verdict(
        payload, signed_data([signer], version="v1"), TrustStore.from_der(alice.der), target
    )
    assert (v.errno, v.policy) == ("EINVAL", False), v.reason


def test_rsa_key_operation_errnos_are_rsa_pkcs1pads(alice: Cert) -> None:
    """pkcs1pad_verify_complete: a block without its leading zero is EINVAL, bad padding
    EBADMSG, a wrong digest EKEYREJECTED, the right one 0 (these reach finit_module as is
    when the key is an embedded certificate's)."""
    import errno
    import hashlib

    from cryptography.hazmat.primitives.asymmetric import padding as pad
    from cryptography.hazmat.primitives.asymmetric import rsa
    from cryptography.hazmat.primitives.hashes import SHA256

    from service.verify.signature.pubkey import PublicKey, SigParams, verify_signature

    key = alice.key
    assert isinstance(key, rsa.RSAPrivateKey)
    numbers = key.private_numbers()
    n, d, size = numbers.public_numbers.n, numbers.d, key.key_size // 8
    der = key.public_key().public_bytes(
        serialization.Encoding.DER, serialization.PublicFormat.PKCS1
    )
    pub = PublicKey("rsa", der)
    digest = hashlib.sha256(b"module").digest()

    def raw(m: int) -> bytes:
        return pow(m, d, n).to_bytes(size, "big")

    def code(sig: bytes, want: bytes = digest) -> int:
        return verify_signature(
            pub, SigParams("rsa", "pkcs1", "sha256", sig, want), have_ecdsa=False
        )

    good = key.sign(b"module", pad.PKCS1v15(), SHA256())
    assert code(good) == 0
    assert code(good, hashlib.sha256(b"other").digest()) == errno.EKEYREJECTED
    assert code(raw(n - 1)) == errno.EINVAL  # full-length block: no leading zero byte
    assert code(raw(2 << (8 * (size - 2)))) == errno.EBADMSG  # 00 02 ...: not type 1
    assert code(good[1:]) == errno.EINVAL  # signature shorter than the modulus


def test_embedded_certificate_time_with_a_non_digit_is_ebadmsg(alice: Cert) -> None:
    """x509_decode_time's dec2bin refuses anything but digits: the whole message fails."""
    import errno

    from service.verify.signature.asn1 import Asn1Error
    from service.verify.signature.x509 import parse_certificate

    der = bytearray(alice.der)
    at = der.index(b"\x17\x0d") + 3  # second digit of notBefore's UTCTime
    der[at] = 0xA0
    with pytest.raises(Asn1Error) as exc:
        parse_certificate(
            bytes(der), rules=KernelRules.parser((6, 1), frozenset({"sha256"}), ecdsa=False)
        )
    assert exc.value.code == errno.EBADMSG and "not a digit" in exc.value.why

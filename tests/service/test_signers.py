"""``signers.py`` against Linux 6.1's rules for messages that carry certificates.

``sign-file`` leaves every certificate out (``CMS_NOCERTS``), so a module signed the usual
way never reaches the kernel's chain walk. Here the messages carry them: chains built with
``cryptography``'s PKCS#7 builder (detached, no signed attributes, as a module signature
must be), and, where the order of the signers matters, with :mod:`tests.kmod.pkcs7`. Each
test names the kernel function whose rule it checks (crypto/asymmetric_keys/pkcs7_verify.c,
pkcs7_trust.c, x509_public_key.c, asymmetric_type.c) and works on the parsed message, the
digests of the signed bytes and a keyring, as ``verify_pkcs7_message_sig`` does.
"""

from __future__ import annotations

import datetime
import errno
import functools
import hashlib
from collections.abc import Sequence

import pytest
from asn1crypto import cms as asn1_cms
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa
from cryptography.hazmat.primitives.serialization import pkcs7
from cryptography.x509.oid import NameOID

from service.verify.signature.pkcs7 import Message, parse_message
from service.verify.signature.pubkey import PublicKey
from service.verify.signature.signers import (
    KernelKey,
    KeySet,
    Refused,
    Trusted,
    pkcs7_verify,
    validate_trust,
)
from service.verify.signature.trust import TrustStore
from service.verify.signature.x509 import Cert as Carried
from service.verify.targetkernel.rules import KernelRules
from tests.kmod.pkcs7 import Cert, signed_data, signer_info, tlv

PAYLOAD = b"\x7fELF module bytes the signature covers"
HASHES = frozenset({"sha256", "sha384", "sha512"})  # what the target kernel can digest
_T0 = datetime.datetime(2024, 1, 1, tzinfo=datetime.UTC)
_OPTIONS = [
    pkcs7.PKCS7Options.DetachedSignature,
    pkcs7.PKCS7Options.NoAttributes,
    pkcs7.PKCS7Options.Binary,
]


@functools.cache
def key(name: str) -> rsa.RSAPrivateKey:
    """One RSA-2048 key per name, made once per test process."""
    return rsa.generate_private_key(65537, 2048)


def _skid(cert: Cert) -> bytes:
    ext = x509.load_der_x509_certificate(cert.der).extensions
    return ext.get_extension_for_class(x509.SubjectKeyIdentifier).value.digest


def issue(
    cn: str,
    holder: str,
    *,
    by: Cert | None = None,
    serial: int,
    akid: str = "keyid",
    keyid: bytes | None = None,
    skid: bytes | None = None,
) -> Cert:
    """A certificate for ``holder``'s key, issued by ``by`` (self-signed without one).

    ``akid`` is what its authorityKeyIdentifier holds: ``keyid`` (the issuer's SKID, which
    the kernel keeps as ``auth_ids[1]``), ``name`` (authorityCertIssuer and
    authorityCertSerialNumber: the issuer certificate's own issuer and serial, its id
    ``auth_ids[0]``) or ``both``; ``keyid`` overrides the key identifier written, ``skid``
    the certificate's own subjectKeyIdentifier.
    """
    own = key(holder)
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, cn)])
    own_skid = skid or x509.SubjectKeyIdentifier.from_public_key(own.public_key()).digest
    signing: rsa.RSAPrivateKey | ec.EllipticCurvePrivateKey = own
    issuer, issuer_skid = name, own_skid
    issuer_id = (name, serial)  # the issuer's certificate: its issuer's name, its serial
    if by is not None:
        parent = x509.load_der_x509_certificate(by.der)
        signing, issuer, issuer_skid = by.key, parent.subject, _skid(by)
        issuer_id = (parent.issuer, parent.serial_number)
    named = akid in ("name", "both")
    authority = x509.AuthorityKeyIdentifier(
        keyid or issuer_skid if akid in ("keyid", "both") else None,
        [x509.DirectoryName(issuer_id[0])] if named else None,
        issuer_id[1] if named else None,
    )
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(issuer)
        .public_key(own.public_key())
        .serial_number(serial)
        .not_valid_before(_T0)
        .not_valid_after(_T0 + datetime.timedelta(days=3650))
        .add_extension(x509.BasicConstraints(ca=by is None, path_length=None), critical=True)
        .add_extension(x509.SubjectKeyIdentifier(own_skid), critical=False)
        .add_extension(authority, critical=False)
        .sign(signing, hashes.SHA256())
    )
    return Cert(own, cert.public_bytes(serialization.Encoding.DER))


def cms(signer: Cert, *, carry: Sequence[Cert] = ()) -> bytes:
    """A module signature by ``signer`` (SHA-256) made with cryptography's PKCS#7 builder:
    the signer's certificate and ``carry`` embedded, no signed attributes, detached."""
    builder = pkcs7.PKCS7SignatureBuilder().set_data(PAYLOAD)
    builder = builder.add_signer(
        x509.load_der_x509_certificate(signer.der), signer.key, hashes.SHA256()
    )
    for cert in carry:
        builder = builder.add_certificate(x509.load_der_x509_certificate(cert.der))
    return builder.sign(serialization.Encoding.DER, _OPTIONS)


def ordered(signers: list[asn1_cms.SignerInfo], certs: Sequence[Cert] = ()) -> bytes:
    """A SignedData with ``signers`` in this order and ``certs`` carried. DER sorts a SET OF
    (asn1crypto does), so the SignerInfos go as the SEQUENCE OF that 6.1's pkcs7.asn1 also
    takes (``SignerInfos ::= CHOICE``), which keeps the order the kernel walks them in."""
    blob = signed_data(signers, certs=tuple(c.der for c in certs))
    as_set = asn1_cms.SignerInfos(signers).dump()
    assert blob.count(as_set) == 1
    return blob.replace(as_set, tlv(0x30, b"".join(s.dump() for s in signers)))


def parsed(blob: bytes) -> Message:
    """The message as 6.1's parser reads it."""
    return parse_message(blob, rules=KernelRules.parser((6, 1), HASHES, ecdsa=False))


def digests(*names: str) -> dict[str, bytes]:
    """The digests of the signed bytes the target can compute (``pkcs7_digest``)."""
    return {name: hashlib.new(name, PAYLOAD).digest() for name in names}


def keyring(*trusted: Cert) -> KeySet:
    """The keyring 6.1 builds from ``trusted`` (through the trust store, as the product)."""
    store = TrustStore.from_der(*(c.der for c in trusted))
    return store.kernel_keys(KernelRules.parser((6, 1), HASHES, ecdsa=False))[0]


def decide(
    blob: bytes, trusted: Sequence[Cert], available: Sequence[str] = ("sha256",)
) -> tuple[Message, Trusted]:
    """``pkcs7_verify`` then ``pkcs7_validate_trust``; the message (its certificates keep
    the walk's marks) and the signer that verified. Raises :class:`Refused`."""
    msg, have = parsed(blob), digests(*available)
    pkcs7_verify(msg, have, False)
    return msg, validate_trust(msg, keyring(*trusted), have, False)


def cert_named(msg: Message, subject: str) -> Carried:
    """The certificate the message carries for ``subject``."""
    return next(c for c in msg.certs if c.subject == subject)


def refusal(
    blob: bytes, trusted: Sequence[Cert], available: Sequence[str] = ("sha256",)
) -> Refused:
    """The :class:`Refused` that :func:`decide` raises (the test fails if none)."""
    with pytest.raises(Refused) as caught:
        decide(blob, trusted, available)
    return caught.value


# --- find_asymmetric_key (asymmetric_type.c), given one id or two ----------------------------


def _kernel_key(ident: bytes, skid: bytes | None, subject: str) -> KernelKey:
    return KernelKey(ident, skid, PublicKey("rsa", b""), subject, "test")


def test_find_with_two_ids_looks_up_the_first_and_requires_the_second_as_the_keys_skid() -> None:
    """find_asymmetric_key(id_0, id_1): the search is by id_0 alone; the key it finds must
    also have id_1 as its second id (kids->id[1], the SKID), else EKEYREJECTED, also when the
    key has no SKID. Given one id, that id matches either of a key's ids. Not found is
    ENOKEY, naming the id looked for; an empty id ("ex:" with no hex) is EINVAL
    (asymmetric_key_hex_to_key_id)."""
    ring = KeySet([_kernel_key(b"serial+ca", b"ca-skid", "ca"), _kernel_key(b"bare", None, "bare")])
    assert ring.find(b"serial+ca", b"ca-skid").subject == "ca"
    assert ring.find(b"serial+ca", None).subject == "ca"
    assert ring.find(None, b"ca-skid").subject == "ca"
    assert ring.find(b"ca-skid", None).subject == "ca"
    assert ring.find(b"bare", None).subject == "bare"
    for id_0, id_1 in ((b"serial+ca", b"other-skid"), (b"bare", b"ca-skid")):
        with pytest.raises(Refused) as rejected:
            ring.find(id_0, id_1)
        assert rejected.value.code == errno.EKEYREJECTED, (id_0, id_1)
    with pytest.raises(Refused) as missing:
        ring.find(b"reissued-serial+ca", b"ca-skid")  # the SKID is known, id_0 is not
    assert missing.value.code == errno.ENOKEY
    assert b"reissued-serial+ca".hex() in missing.value.why
    with pytest.raises(Refused) as empty:
        ring.find(b"", b"ca-skid")
    assert empty.value.code == errno.EINVAL


# --- pkcs7_verify_sig_chain (pkcs7_verify.c): the certificates a message carries -----------

AKIDS = ("keyid", "name", "both")


@pytest.mark.parametrize("akid", AKIDS)
def test_carried_chain_is_linked_from_the_signer_up_to_its_self_signed_root(akid: str) -> None:
    """pkcs7_verify_sig_chain: from the signer's certificate, each carried issuer found by
    the AKID (issuer+serial as auth_ids[0], else the keyid as auth_ids[1] against a SKID)
    verifies the one below it and becomes its signer; a self-signed root
    (x509_check_for_self_signed) is its own signer and ends the walk."""
    root = issue("chain root", "root", serial=1, akid=akid)
    mid = issue("chain intermediate", "mid", by=root, serial=2, akid=akid)
    leaf = issue("chain leaf", "leaf", by=mid, serial=3, akid=akid)
    msg = parsed(cms(leaf, carry=(mid, root)))
    pkcs7_verify(msg, digests("sha256"), False)
    links = {c.subject: c.signer.subject if c.signer else None for c in msg.certs}
    assert links == {
        "chain leaf": "chain intermediate",
        "chain intermediate": "chain root",
        "chain root": "chain root",
    }


@pytest.mark.parametrize("akid", AKIDS)
def test_a_carried_issuer_must_verify_the_certificate_below_it(akid: str) -> None:
    """pkcs7_verify_sig_chain returns public_key_verify_signature's error when the carried
    certificate the AKID names does not verify the one below it, and pkcs7_verify fails
    with it, though a trusted key would have verified that link: a forged CA (the real CA's
    name, serial and SKID, another key) carried beside a leaf of the real CA. Without it the
    same leaf is accepted through the trusted CA."""
    ca = issue("carried ca", "ca", serial=10, akid=akid)
    forged = issue("carried ca", "forger", serial=10, akid=akid, skid=_skid(ca), keyid=_skid(ca))
    leaf = issue("carried leaf", "leaf", by=ca, serial=11, akid=akid)
    msg = parsed(cms(leaf, carry=(forged,)))
    with pytest.raises(Refused) as refused:
        pkcs7_verify(msg, digests("sha256"), False)
    assert refused.value.code in (errno.EBADMSG, errno.EINVAL), refused.value.why  # pkcs1pad's
    _, trusted = decide(cms(leaf), [ca])
    assert trusted.key.subject == "carried ca"


def test_a_carried_issuer_with_the_akids_name_but_another_skid_is_ekeyrejected() -> None:
    """pkcs7_verify_sig_chain, found_issuer_check_skid: the issuer found by issuer+serial
    must also have the AKID's keyid as its SKID ("auth-skid nonmatch"), else EKEYREJECTED."""
    ca = issue("skid ca", "ca", serial=20)
    leaf = issue("skid leaf", "leaf", by=ca, serial=21, akid="both", keyid=b"\x01" * 20)
    with pytest.raises(Refused) as refused:
        pkcs7_verify(parsed(cms(leaf, carry=(ca,))), digests("sha256"), False)
    assert refused.value.code == errno.EKEYREJECTED


def test_a_loop_of_carried_certificates_ends_the_walk() -> None:
    """pkcs7_verify_sig_chain marks each certificate seen: two certificates issued by each
    other ("X.509 chain contains loop") link once and stop; the trust walk then finds the
    second one's key in the keyring, or nothing."""
    left_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "loop left")])
    right_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "loop right")])

    def crossed(subject: x509.Name, holder: str, issuer: x509.Name, signer: str) -> Cert:
        kid = x509.SubjectKeyIdentifier.from_public_key(key(signer).public_key()).digest
        cert = (
            x509.CertificateBuilder()
            .subject_name(subject)
            .issuer_name(issuer)
            .public_key(key(holder).public_key())
            .serial_number(30)
            .not_valid_before(_T0)
            .not_valid_after(_T0 + datetime.timedelta(days=3650))
            .add_extension(
                x509.SubjectKeyIdentifier.from_public_key(key(holder).public_key()), False
            )
            .add_extension(x509.AuthorityKeyIdentifier(kid, None, None), False)
            .sign(key(signer), hashes.SHA256())
        )
        return Cert(key(holder), cert.public_bytes(serialization.Encoding.DER))

    left = crossed(left_name, "loop-left", right_name, "loop-right")
    right = crossed(right_name, "loop-right", left_name, "loop-left")
    msg, trusted = decide(cms(left, carry=(right,)), [right])
    assert trusted.key.subject == "loop right"
    left_cert, right_cert = cert_named(msg, "loop left"), cert_named(msg, "loop right")
    assert left_cert.signer is right_cert
    assert right_cert.signer is None
    assert refusal(cms(left, carry=(right,)), [issue("other", "other", serial=31)]).code == (
        errno.ENOKEY
    )


# --- pkcs7_validate_trust_one (pkcs7_trust.c): from the carried chain to the keyring --------


@pytest.mark.parametrize("akid", AKIDS)
def test_the_last_carried_certificates_authority_is_looked_up_in_the_keyring(akid: str) -> None:
    """pkcs7_validate_trust_one: no carried certificate is trusted, so the AKID of the last
    one (either id: auth_ids[0] or auth_ids[1]) is looked for in the keyring, and the key
    found verifies that certificate; the chain below it is marked verified."""
    ca = issue("authority ca", "ca", serial=40, akid=akid)
    leaf = issue("authority leaf", "leaf", by=ca, serial=41, akid=akid)
    msg, trusted = decide(cms(leaf), [ca])
    assert trusted.key.subject == "authority ca"
    assert cert_named(msg, "authority leaf").verified


def test_the_authority_lookup_is_by_issuer_and_serial_and_its_keyid_must_match() -> None:
    """pkcs7_validate_trust_one looks the last certificate's authority up with
    find_asymmetric_key(auth_ids[0], auth_ids[1]): a trusted CA with that issuer+serial
    but another SKID is EKEYREJECTED, returned as it is; a re-issued CA (same key and SKID,
    another serial) is not found by issuer+serial: ENOKEY."""
    ca = issue("lookup ca", "ca", serial=50)
    wrong_kid = issue("lookup leaf", "leaf", by=ca, serial=51, akid="both", keyid=b"\x02" * 20)
    assert refusal(cms(wrong_kid), [ca]).code == errno.EKEYREJECTED
    reissued = issue("lookup ca", "ca", serial=59)
    leaf = issue("lookup leaf", "leaf", by=ca, serial=52, akid="both")
    assert refusal(cms(leaf), [reissued]).code == errno.ENOKEY
    _, trusted = decide(cms(leaf), [ca])
    assert trusted.key.subject == "lookup ca"


def test_a_carried_signer_certificate_that_is_itself_trusted_verifies_the_module() -> None:
    """pkcs7_validate_trust_one: the first carried certificate found in the keyring
    (find_asymmetric_key(x509->id, x509->skid)) verifies the signature directly."""
    ca = issue("direct ca", "ca", serial=60)
    leaf = issue("direct leaf", "leaf", by=ca, serial=61)
    msg, trusted = decide(cms(leaf), [leaf])
    assert trusted.key.subject == "direct leaf"
    assert cert_named(msg, "direct leaf").verified


def test_the_walk_up_a_carried_chain_stops_at_the_first_trusted_certificate() -> None:
    """pkcs7_validate_trust_one walks x509->signer up the carried chain; the first trusted
    certificate's key verifies the signature of the certificate below it (sig = last->sig),
    and it and everything below it are marked verified, the ones above are not."""
    root = issue("walk root", "root", serial=70)
    mid = issue("walk intermediate", "mid", by=root, serial=71)
    leaf = issue("walk leaf", "leaf", by=mid, serial=72)
    blob = cms(leaf, carry=(mid, root))
    for anchor, name, above in (
        (root, "walk root", ()),
        (mid, "walk intermediate", ("walk root",)),
    ):
        msg, trusted = decide(blob, [anchor])
        assert trusted.key.subject == name
        marks = {c.subject: c.verified for c in msg.certs}
        assert marks == {s: s not in above for s in marks}, marks


def test_a_carried_self_signed_certificate_nobody_trusts_is_enokey() -> None:
    """pkcs7_validate_trust_one: an unknown self-signed certificate is a root of its own
    ("ENOKEY [unknown self-signed]"); the direct lookup of the signer's id is not tried,
    so a forged self-signed certificate with a trusted key's issuer+serial is ENOKEY, not
    that key's EKEYREJECTED (its SKID differs: find_asymmetric_key rejects the match)."""
    trusted = issue("alice", "alice", serial=80)
    forged = issue("alice", "mallory", serial=80)
    for blob in (cms(forged), cms(issue("lone", "lone", serial=81))):
        refused = refusal(blob, [trusted])
        assert refused.code == errno.ENOKEY
        assert "self-signed" in refused.why
    rogue_root = issue("rogue root", "root", serial=82)
    under_rogue = issue("rogue leaf", "leaf", by=rogue_root, serial=83)
    assert refusal(cms(under_rogue, carry=(rogue_root,)), [trusted]).code == errno.ENOKEY


def test_a_skid_signer_is_not_matched_to_a_carried_certificate() -> None:
    """pkcs7_find_key compares a carried certificate's id (serial || issuer) with the
    signer's auth_ids[0], which is the SKID for a v3 SignerInfo: never the same, so such a
    signer has no chain and only the direct lookup by SKID can trust it."""
    ca = issue("skid-form ca", "ca", serial=90)
    leaf = issue("skid-form leaf", "leaf", by=ca, serial=91)
    blob = ordered([signer_info(PAYLOAD, leaf, skid=True)], (leaf,))
    assert refusal(blob, [ca]).code == errno.ENOKEY
    _, trusted = decide(blob, [leaf])
    assert trusted.key.subject == "skid-form leaf"


# --- pkcs7_validate_trust: several signers ---------------------------------------------------


def test_one_trusted_signer_among_untrusted_ones_suffices_in_either_order() -> None:
    """pkcs7_validate_trust: ENOKEY for one signer is skipped; a signer whose chain meets
    the keyring makes the message trusted, before or after the untrusted one."""
    ca = issue("order ca", "ca", serial=100)
    leaf = issue("order leaf", "leaf", by=ca, serial=101)
    rogue = issue("order rogue", "rogue", serial=102)
    good, bad = signer_info(PAYLOAD, leaf), signer_info(PAYLOAD, rogue)
    for order in ([good, bad], [bad, good]):
        blob = ordered(order, (leaf, rogue))
        _, trusted = decide(blob, [ca])
        assert trusted.key.subject == "order ca"
        assert trusted.signer.index == 1 + order.index(good)


def test_enokey_names_the_signer_when_alone_and_all_when_several() -> None:
    """pkcs7_validate_trust: no signer trusted is ENOKEY. With one signer the refusal says
    why that one failed (the key id it looked for); with several, that none is trusted."""
    trusted = issue("someone", "someone", serial=110)
    one, two = (
        issue("nobody one", "nobody-1", serial=111),
        issue("nobody two", "nobody-2", serial=112),
    )
    alone = refusal(ordered([signer_info(PAYLOAD, one)]), [trusted])
    assert alone.code == errno.ENOKEY
    assert parsed(ordered([signer_info(PAYLOAD, one)])).signers[0].auth_id.hex() in alone.why
    both = refusal(ordered([signer_info(PAYLOAD, one), signer_info(PAYLOAD, two)]), [trusted])
    assert both.code == errno.ENOKEY
    assert both.why == "no signer's key is trusted"


def test_a_second_signer_through_an_untrusted_chain_is_refused_from_the_cache() -> None:
    """pkcs7_validate_trust_one: a certificate already seen and not verified is
    "ENOKEY [cached]" for the next signer through it; every certificate walked is seen."""
    root = issue("cached root", "root", serial=120)
    leaf = issue("cached leaf", "leaf", by=root, serial=121)
    signers = [signer_info(PAYLOAD, leaf), signer_info(PAYLOAD, leaf, hash="sha384")]
    blob = ordered(signers, (leaf, root))
    msg = parsed(blob)
    have = digests("sha256", "sha384")
    pkcs7_verify(msg, have, False)
    with pytest.raises(Refused) as refused:
        validate_trust(msg, keyring(issue("elsewhere", "other", serial=122)), have, False)
    assert refused.value.code == errno.ENOKEY
    assert all(c.seen and not c.verified for c in msg.certs)


def test_the_cache_refuses_a_signer_its_own_walk_would_have_trusted() -> None:
    """pkcs7_validate_trust_one returns "ENOKEY [cached]" at a certificate an earlier signer
    found untrusted, before its own last resort (the direct lookup of the signer's id):
    two leaves of one carried, untrusted intermediate, the keyring holding a certificate
    with the second leaf's issuer+serial and key (another SKID, so the walk skips it). The
    second signer alone is trusted directly; after the first, it is ENOKEY."""
    root = issue("cache root", "root", serial=140)
    mid = issue("cache intermediate", "mid", by=root, serial=141)
    first = issue("cache leaf one", "leaf", by=mid, serial=142)
    second = issue("cache leaf two", "leaf-2", by=mid, serial=143)
    twin = issue("cache leaf two", "leaf-2", by=mid, serial=143, skid=b"\x03" * 20)
    alone = ordered([signer_info(PAYLOAD, second)], (second, mid))
    assert decide(alone, [twin])[1].key.subject == "cache leaf two"
    both = ordered(
        [signer_info(PAYLOAD, first), signer_info(PAYLOAD, second)], (first, second, mid)
    )
    assert refusal(both, [twin]).code == errno.ENOKEY


def test_the_trusted_certificate_and_the_chain_below_it_are_marked_verified() -> None:
    """pkcs7_validate_trust_one marks the certificate the trusted key matched, and every one
    below it, verified: the mark a later signer through the same CA is trusted by
    ("goto verified"). Two leaves of one carried CA: the first signer decides."""
    ca = issue("shared ca", "ca", serial=130)
    first = issue("shared leaf one", "leaf", by=ca, serial=131)
    second = issue("shared leaf two", "leaf-2", by=ca, serial=132)
    signers = [signer_info(PAYLOAD, first), signer_info(PAYLOAD, second)]
    blob = ordered(signers, (first, second, ca))
    msg, trusted = decide(blob, [ca])
    assert (trusted.signer.index, trusted.key.subject) == (1, "shared ca")
    assert cert_named(msg, "shared ca").verified and cert_named(msg, "shared leaf one").verified


# --- an unsupported digest (pkcs7_verify, pkcs7_validate_trust) ------------------------------


def test_a_signer_whose_digest_the_target_lacks_is_skipped_in_either_order() -> None:
    """pkcs7_verify: a signer whose digest cannot be computed (ENOPKG) is marked
    unsupported_crypto and skipped, not verified against its key (which would fail);
    pkcs7_validate_trust returns the cached ENOPKG for it: another trusted signer decides."""
    alice, bob = issue("alice", "alice", serial=140), issue("bob", "bob", serial=141)
    unsupported = signer_info(PAYLOAD, alice, hash="sha512")
    fine = signer_info(PAYLOAD, bob)
    for order in ([unsupported, fine], [fine, unsupported]):
        msg, trusted = decide(ordered(order), [alice, bob])
        assert trusted.key.subject == "bob"
        assert [s.unsupported_crypto for s in msg.signers] == [s is unsupported for s in order]


def test_no_signer_with_an_available_digest_is_enopkg() -> None:
    """pkcs7_verify returns -ENOPKG when no signer could be verified for want of a digest."""
    alice = issue("alice", "alice", serial=150)
    msg = parsed(ordered([signer_info(PAYLOAD, alice, hash="sha512")]))
    with pytest.raises(Refused) as refused:
        pkcs7_verify(msg, digests("sha256"), False)
    assert refused.value.code == errno.ENOPKG
    assert "digest" in refused.value.why


def test_enopkg_outranks_enokey_whatever_the_order() -> None:
    """pkcs7_validate_trust: with no signer trusted, a signer skipped for its digest makes
    the answer ENOPKG rather than ENOKEY, before or after the unknown signer."""
    alice = issue("alice", "alice", serial=160)
    stranger = issue("stranger", "stranger", serial=161)
    unsupported = signer_info(PAYLOAD, alice, hash="sha512")
    unknown = signer_info(PAYLOAD, stranger)
    for order in ([unsupported, unknown], [unknown, unsupported]):
        assert refusal(ordered(order), [alice]).code == errno.ENOPKG

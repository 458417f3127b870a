"""The appended-signature trailer and the PKCS#7 rules, checked as the kernel checks them."""

from __future__ import annotations

import contextlib
import errno
import io
from pathlib import Path

import pytest
from asn1crypto import cms
from cryptography import x509
from hypothesis import given, settings
from hypothesis import strategies as st

from service.errors import ModuleRejected
from service.verify.signature.asn1 import Asn1Error
from service.verify.signature.pkcs7 import Message, parse_message
from service.verify.signature.trailer import parse_trailer
from service.verify.signature.trust import TrustStore
from service.verify.targetkernel.kernel import Target
from service.verify.targetkernel.rules import KernelRules
from service.verify.verdict import verify_module
from tests.kmod import MARKER, SigningKey, cms_sign, split
from tests.kmod.forge import INFO, append_signature, rsa_oid_as_sha256_with_rsa
from tests.service.strategies_verify import der, mutated, trailers


def trailer_of(*, sig_len: int, id_type: int = 2, pad: bytes = b"\0\0\0", **fields: int) -> bytes:
    values = [fields.get(k, 0) for k in ("algo", "hash", "signer_len", "key_id_len")]
    return INFO.pack(values[0], values[1], id_type, values[2], values[3], pad, sig_len) + MARKER


def reason(exc: pytest.ExceptionInfo[ModuleRejected]) -> str:
    return exc.value.reason


def test_trailer_of_sign_file_output_splits_payload_and_blob(signed_rsa: Path) -> None:
    """The signed length and sig_len are exactly the payload and the DER blob sign-file wrote."""
    data = signed_rsa.read_bytes()
    parts = split(data)
    trailer = parse_trailer(data[-40:], len(data))
    assert (trailer.signed_len, trailer.sig_len) == (len(parts.payload), len(parts.blob))


@pytest.mark.parametrize("tail", [b"", b"\0" * 40, MARKER[:-1], b"x" + MARKER[1:]])
def test_missing_marker_is_unsigned(tail: bytes) -> None:
    """No marker at the end means ENODATA (unsigned), as module_sig_check decides."""
    with pytest.raises(ModuleRejected) as exc:
        parse_trailer(tail, len(tail))
    assert reason(exc).startswith("ENODATA")


def test_marker_alone_is_unsigned_and_marker_plus_info_too_short() -> None:
    """A file of only the marker is unsigned; with 12 more bytes it is too short (EBADMSG)."""
    with pytest.raises(ModuleRejected) as exc:
        parse_trailer(MARKER, len(MARKER))
    assert reason(exc).startswith("ENODATA")
    with pytest.raises(ModuleRejected) as exc:
        parse_trailer(trailer_of(sig_len=0), 40)
    assert reason(exc).startswith("EBADMSG: file too short")


def test_sig_len_boundary_follows_mod_check_sig() -> None:
    """sig_len must be < modlen - 12: one byte of payload is the least the kernel accepts."""
    assert parse_trailer(trailer_of(sig_len=99), 140).signed_len == 1
    with pytest.raises(ModuleRejected) as exc:
        parse_trailer(trailer_of(sig_len=100), 140)
    assert reason(exc).startswith("EBADMSG: sig_len 100")


def test_oversized_sig_len_is_checked_before_id_type() -> None:
    """Kernel order: an impossible sig_len is EBADMSG even when id_type is also wrong."""
    with pytest.raises(ModuleRejected) as exc:
        parse_trailer(trailer_of(sig_len=1 << 31, id_type=1), 5000)
    assert reason(exc).startswith("EBADMSG: sig_len")


@pytest.mark.parametrize("id_type", [0, 1, 3, 255])
def test_id_type_other_than_pkcs7_is_enopkg(id_type: int) -> None:
    """id_type must be PKEY_ID_PKCS7 (2); anything else is ENOPKG."""
    with pytest.raises(ModuleRejected) as exc:
        parse_trailer(trailer_of(sig_len=10, id_type=id_type), 5000)
    assert reason(exc).startswith(f"ENOPKG: signature id_type {id_type}")


@pytest.mark.parametrize(
    "fields",
    [{"algo": 1}, {"hash": 4}, {"signer_len": 1}, {"key_id_len": 20}, {"pad": b"\0\0\1"}],
)
def test_non_zero_info_fields_are_ebadmsg(fields: dict[str, object]) -> None:
    """Every field but id_type and sig_len must be zero, pad included."""
    with pytest.raises(ModuleRejected) as exc:
        parse_trailer(trailer_of(sig_len=10, **fields), 5000)  # type: ignore[arg-type]
    assert reason(exc).startswith("EBADMSG: module_signature has non-zero")


def test_sig_len_is_bounded_only_by_the_file() -> None:
    """mod_check_sig has no cap of its own: a 64 KiB blob is a layout (the decoder refuses it)."""
    assert parse_trailer(trailer_of(sig_len=1 << 16), 1 << 20).sig_len == 1 << 16


@pytest.mark.parametrize("size", [0, 1, 39, 40])
def test_a_file_shorter_than_a_trailer_is_unsigned(size: int, tmp_path: Path) -> None:
    """A file of fewer bytes than a trailer is read from its start, not before it: unsigned
    (ENODATA), for a file on disk as for one in memory."""
    from service.errors import Refusal
    from service.verify.signature.modsig import read_signature

    path = tmp_path / "tiny.ko"
    path.write_bytes(b"\x7fELF"[:size] + bytes(max(0, size - 4)))
    problems: list[Refusal] = []
    with path.open("rb") as f:
        read = read_signature(f, size, problems, Target.from_spec("6.1.0-57-amd64"))
    assert read == (size, None)
    assert [str(p) for p in problems] == ["ENODATA: module is unsigned (no signature marker)"]


def test_a_blob_over_the_decoders_limit_is_emsgsize_before_it_is_parsed(
    signed_rsa: Path, trust: TrustStore, target: Target
) -> None:
    """A module whose trailer states a 70,000-byte blob is refused with EMSGSIZE, naming the
    size and the kernel's limit, even when that blob is a good signature followed by zeros
    (which the 6.1 parser, trailing bytes ignored, would otherwise accept); a blob of exactly
    65,535 bytes, the same signature padded, is accepted."""
    parts = split(signed_rsa.read_bytes())
    padded = parts.blob + bytes(70_000 - len(parts.blob))
    largest = append_signature(parts.payload, parts.blob + bytes(65_535 - len(parts.blob)))
    assert verify_module(io.BytesIO(largest), display="m.ko", trust=trust, kernel=target).ok
    module = append_signature(parts.payload, padded)
    v = verify_module(io.BytesIO(module), display="m.ko", trust=trust, kernel=target)
    assert (v.ok, v.errno) == (False, "EMSGSIZE"), v.reason
    assert v.reason == "EMSGSIZE: PKCS#7 blob of 70000 bytes (kernel max 65535)"


@settings(max_examples=400)
@given(trailers())
def test_fuzz_trailer_only_domain_error_and_consistent_layout(case: tuple[bytes, int]) -> None:
    """Any tail: either a layout that adds up to the file length, or ModuleRejected."""
    tail, file_len = case
    try:
        trailer = parse_trailer(tail, file_len)
    except ModuleRejected:
        return
    assert trailer.signed_len >= 1
    assert trailer.signed_len + trailer.sig_len + 40 == file_len


def blob(path: Path) -> bytes:
    return split(path.read_bytes()).blob


DEBIAN_HASHES = frozenset({"md5", "sha1", "sha224", "sha256", "sha384", "sha512"})


def parse(data: bytes) -> Message:
    return parse_message(data, rules=KernelRules.parser((6, 1), DEBIAN_HASHES, ecdsa=False))


def refused(data: bytes) -> str:
    with pytest.raises(Asn1Error) as exc:
        parse(data)
    return f"{errno.errorcode[exc.value.code]}: {exc.value.why}"


def test_issuer_serial_key_id_is_raw_serial_then_issuer(
    signed_rsa: Path, rsa_key: SigningKey
) -> None:
    """SignerInfo v1: key id = serial INTEGER content || issuer Name content, as the kernel's."""
    cert = x509.load_der_x509_certificate(rsa_key.cert_der.read_bytes())
    serial = cert.serial_number.to_bytes((cert.serial_number.bit_length() + 8) // 8, "big")
    issuer = cert.issuer.public_bytes()
    issuer_content = (
        issuer[4:] if issuer[1] == 0x82 else issuer[3:] if issuer[1] == 0x81 else issuer[2:]
    )
    (sig,) = parse(blob(signed_rsa)).signers
    assert (sig.pkey_algo, sig.hash_algo, sig.skid_form) == ("rsa", "sha256", False)
    assert sig.auth_id == serial + issuer_content


def test_skid_key_id_is_the_subject_key_identifier(signed_ec: Path, ec_key: SigningKey) -> None:
    """SignerInfo v3 (sign-file -k): key id = the certificate's raw SKID."""
    cert = x509.load_der_x509_certificate(ec_key.cert_der.read_bytes())
    skid = cert.extensions.get_extension_for_class(x509.SubjectKeyIdentifier).value.digest
    (sig,) = parse(blob(signed_ec)).signers
    assert (sig.pkey_algo, sig.hash_algo, sig.auth_id) == ("ecdsa", "sha384", skid)


def test_openssl_signed_attributes_carry_smime_capabilities(
    modules: dict[str, Path], rsa_key: SigningKey, tmp_path: Path
) -> None:
    """openssl cms without -noattr adds S/MIME capabilities: the parser's EKEYREJECTED."""
    signed = cms_sign(modules["ms_params"], rsa_key, tmp_path / "a.ko")
    assert refused(blob(signed)) == (
        "EKEYREJECTED: signed attribute smimeCapabilites outside Authenticode"
    )


def test_sha1_parses_as_61_parses_it(
    modules: dict[str, Path], rsa_key: SigningKey, tmp_path: Path
) -> None:
    """6.1's parser knows SHA-1 (modstage refuses it later, by policy)."""
    signed = cms_sign(
        modules["ms_params"], rsa_key, tmp_path / "a.ko", hash="sha1", attributes=False
    )
    assert parse(blob(signed)).signers[0].hash_algo == "sha1"


def test_sha3_is_unknown_to_the_61_parser(
    modules: dict[str, Path], rsa_key: SigningKey, tmp_path: Path
) -> None:
    """SHA3-256 is not in 6.1's pkcs7_sig_note_digest_algo: ENOPKG, naming the OID."""
    signed = cms_sign(
        modules["ms_params"], rsa_key, tmp_path / "a.ko", hash="sha3-256", attributes=False
    )
    assert refused(blob(signed)) == "ENOPKG: digest algorithm 2.16.840.1.101.3.4.2.8"


def test_sha256_with_rsa_oid_is_enopkg(signed_rsa: Path) -> None:
    """RSA must be announced as rsaEncryption; sha256WithRSAEncryption is ENOPKG."""
    data = split(rsa_oid_as_sha256_with_rsa(signed_rsa.read_bytes())).blob
    assert refused(data) == "ENOPKG: signature algorithm 1.2.840.113549.1.1.11"


def test_ecdsa_with_sha3_oid_is_enopkg(signed_ec: Path) -> None:
    """ecdsa-with-SHA3-384 is not in 6.1's pkcs7_sig_note_pkey_algo: ENOPKG."""
    info = cms.ContentInfo.load(blob(signed_ec))
    signer = info["content"]["signer_infos"][0]
    signer["signature_algorithm"]["algorithm"] = "2.16.840.1.101.3.4.3.11"
    data = info.dump(force=True)
    assert refused(data) == "ENOPKG: signature algorithm 2.16.840.1.101.3.4.3.11"


def test_embedded_content_is_parsed_and_noted(
    modules: dict[str, Path],
    rsa_key: SigningKey,
    tmp_path: Path,
    trust: TrustStore,
    target: Target,
) -> None:
    """Embedded content parses; verify_pkcs7_message_sig then refuses it (EBADMSG), although
    the module is signed by a trusted key."""
    small = tmp_path / "small"
    small.write_bytes(modules["ms_enodev"].read_bytes()[:4096])
    signed = cms_sign(small, rsa_key, tmp_path / "a.ko", attributes=False, detached=False)
    assert parse(blob(signed)).has_data
    with signed.open("rb") as f:
        v = verify_module(f, display="a.ko", trust=trust, kernel=target)
    assert (v.ok, v.errno, v.policy) == (False, "EBADMSG", False), v.reason
    assert v.reason == "EBADMSG: PKCS#7 signature with non-detached data"


def test_signed_data_version_must_match_signer_info(signed_ec: Path) -> None:
    """A v3 (SKID) SignerInfo inside a v1 SignedData is EBADMSG (version coupling)."""
    info = cms.ContentInfo.load(blob(signed_ec))
    info["content"]["version"] = "v1"
    assert (
        refused(info.dump(force=True)) == "EBADMSG: SignerInfo version does not match SignedData's"
    )


@pytest.mark.parametrize("cut", [1, 10, 300])
def test_truncated_der_is_ebadmsg_trailing_bytes_are_ignored(signed_rsa: Path, cut: int) -> None:
    """A truncated blob overruns (EBADMSG); bytes after the ContentInfo are ignored, as in 6.1."""
    der_blob = blob(signed_rsa)
    assert refused(der_blob[:-cut]).startswith("EBADMSG: ")
    assert parse(der_blob + b"\0" * cut).signers


def test_asn1_decoder_limits(signed_rsa: Path) -> None:
    """Over 65,535 bytes is EMSGSIZE; a length with 3 length octets is EBADMSG."""
    der_blob = blob(signed_rsa)
    with pytest.raises(Asn1Error) as exc:
        parse(der_blob + bytes(65536 - len(der_blob)))
    assert exc.value.code == errno.EMSGSIZE
    body = der_blob[4:] if der_blob[1] == 0x82 else der_blob[3:]
    three = b"\x30\x83" + len(body).to_bytes(3, "big") + body
    assert refused(three) == "EBADMSG: unsupported length (3 length octets)"


@settings(max_examples=300, deadline=None)
@given(der)
def test_fuzz_random_der_only_domain_error(data: bytes) -> None:
    """Random DER trees of PKCS#7 tags never raise anything but Asn1Error."""
    with contextlib.suppress(Asn1Error):
        parse(data)


@settings(max_examples=300, deadline=None)
@given(st.data())
def test_fuzz_mutated_real_blobs_only_domain_error(
    signed_rsa: Path, signed_ec: Path, data: st.DataObject
) -> None:
    """Bit flips, cuts and insertions in sign-file blobs never raise anything but Asn1Error."""
    base = blob(data.draw(st.sampled_from([signed_rsa, signed_ec])))
    with contextlib.suppress(Asn1Error):
        parse(data.draw(mutated(base)))

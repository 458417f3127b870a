"""verify_module on real signatures: what the kernel accepts is accepted, the rest says why."""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

import pytest

from service.verify.signature.trust import TrustStore
from service.verify.targetkernel.kernel import Target
from service.verify.verdict import Verdict, verify_path
from tests.hosts import running_host
from tests.kmod import (
    SigningKey,
    append_signature,
    cms_sign,
    flip_bit,
    graft,
    make_key,
    rsa_oid_as_sha256_with_rsa,
    sign,
    split,
)


def check(path: Path, trust: TrustStore, kernel: str | Target) -> Verdict:
    verdict = verify_path(path, trust=trust, kernel=kernel)
    assert verdict.file == str(path)
    return verdict


@pytest.mark.parametrize(
    ("kind", "hash_", "skid"),
    [
        ("rsa4096", "sha256", False),
        ("p384", "sha384", True),
        ("rsa4096", "sha512", False),
        ("rsa2048", "sha256", True),
        ("p256", "sha256", False),
        ("p384", "sha224", False),
    ],
)
def test_sign_file_signatures_are_accepted(
    tmp_path: Path, modules: dict[str, Path], target: Target, kind: str, hash_: str, skid: bool
) -> None:
    """sign-file output for each key type, digest and signer-id form verifies, with identity."""
    key = make_key(tmp_path, kind, cn=f"{kind} signer")
    signed = sign(modules["ms_params"], key, tmp_path / "m.ko", hash=hash_, skid=skid)
    verdict = check(signed, TrustStore.from_der(key.cert_der.read_bytes()), target)
    assert verdict.ok, verdict.reason
    assert (verdict.signer, verdict.hash, verdict.name) == (f"{kind} signer", hash_, "ms_params")
    assert verdict.sha256 == hashlib.sha256(signed.read_bytes()).hexdigest()
    assert verdict.srcversion is not None and verdict.vermagic.startswith(target.release)  # type: ignore[union-attr]


def test_identity_fields_of_a_consumer(
    tmp_path: Path, modules: dict[str, Path], rsa_key: SigningKey, trust: TrustStore, target: Target
) -> None:
    """depends and firmware come from .modinfo; key_id is the kernel's "ex:" id in hex. The
    consumer alone imports a symbol no one exports: ENOENT, naming it, identity still filled."""
    consumer = check(sign(modules["ms_consumer"], rsa_key, tmp_path / "c.ko"), trust, target)
    firmware = check(sign(modules["ms_firmware"], rsa_key, tmp_path / "f.ko"), trust, target)
    assert consumer.depends == ("ms_exporter",) and consumer.errno == "ENOENT"
    assert "Unknown symbol ms_exporter_value" in (consumer.reason or ""), consumer.reason
    assert firmware.ok and firmware.firmware == ("modstage/test.bin",)
    found = trust.find(bytes.fromhex(consumer.key_id or ""))
    assert found is not None and found.subject == "modstage rsa"


def file_with(tmp_path: Path, data: bytes, name: str = "m.ko") -> Path:
    path = tmp_path / name
    path.write_bytes(data)
    return path


Edit = Callable[[bytes], bytes]
PAYLOAD_EDITS: dict[str, Edit] = {
    "flip byte 0": lambda d: flip_bit(d, 0),
    "flip byte 100": lambda d: flip_bit(d, 100, 3),
    "flip middle": lambda d: flip_bit(d, len(split(d).payload) // 2, 7),
    "flip last signed byte": lambda d: flip_bit(d, len(split(d).payload) - 1),
    "flip signature value": lambda d: flip_bit(d, -41),
}
TRAILER_EDITS: dict[str, tuple[Edit, str]] = {
    "truncated PKCS#7": (lambda d: split(d).with_(blob=split(d).blob[:-100]), "EBADMSG: malformed"),
    "half PKCS#7": (lambda d: split(d).with_(blob=split(d).blob[:300]), "EBADMSG: malformed"),
    "stale sig_len": (
        lambda d: split(d).with_(blob=split(d).blob[40:], sig_len=len(split(d).blob)),
        "EBADMSG: malformed",
    ),
    "sig_len past the file": (lambda d: split(d).with_(sig_len=len(d)), "EBADMSG: sig_len"),
    "id_type 1": (lambda d: split(d).with_(id_type=1), "ENOPKG: signature id_type 1"),
    "non-zero pad": (lambda d: split(d).with_(pad=b"\0\x01\0"), "EBADMSG: module_signature"),
    "sha256WithRSAEncryption": (rsa_oid_as_sha256_with_rsa, "ENOPKG: signature algorithm"),
    "unsigned": (lambda d: split(d).payload, "ENODATA: module is unsigned"),
}


@pytest.mark.parametrize("edit", PAYLOAD_EDITS.values(), ids=PAYLOAD_EDITS.keys())
def test_one_flipped_bit_is_ekeyrejected(
    tmp_path: Path, signed_rsa: Path, trust: TrustStore, target: Target, edit: Edit
) -> None:
    """Any changed bit of the signed bytes or the signature value: the key rejects it."""
    verdict = check(file_with(tmp_path, edit(signed_rsa.read_bytes())), trust, target)
    assert not verdict.ok
    assert (
        verdict.reason == "EKEYREJECTED: signature does not match the module (key 'modstage rsa')"
    )


@pytest.mark.parametrize("case", TRAILER_EDITS.values(), ids=TRAILER_EDITS.keys())
def test_broken_trailers_are_rejected_with_their_rule(
    tmp_path: Path, signed_rsa: Path, trust: TrustStore, target: Target, case: tuple[Edit, str]
) -> None:
    """Each defect of the trailer or the PKCS#7 blob is refused with the rule it breaks."""
    edit, expected = case
    verdict = check(file_with(tmp_path, edit(signed_rsa.read_bytes())), trust, target)
    assert not verdict.ok
    assert verdict.reason is not None and verdict.reason.startswith(expected), verdict.reason


def test_identity_is_reported_on_rejection(
    tmp_path: Path, signed_rsa: Path, trust: TrustStore, target: Target
) -> None:
    """A rejected module still shows its name, vermagic and file digest to the operator."""
    data = split(signed_rsa.read_bytes()).with_(id_type=1)
    verdict = check(file_with(tmp_path, data), trust, target)
    assert (verdict.ok, verdict.name) == (False, "ms_params")
    assert verdict.vermagic is not None and verdict.sha256 == hashlib.sha256(data).hexdigest()


def test_wrong_certificate_is_enokey(
    tmp_path: Path,
    modules: dict[str, Path],
    other_key: SigningKey,
    trust: TrustStore,
    target: Target,
) -> None:
    """A signer the trust store does not hold: ENOKEY, naming the key id."""
    verdict = check(sign(modules["ms_params"], other_key, tmp_path / "m.ko"), trust, target)
    assert not verdict.ok and verdict.reason is not None
    assert verdict.reason.startswith("ENOKEY: no trusted certificate has key id ")
    assert verdict.key_id is not None and verdict.key_id in verdict.reason


def test_same_issuer_and_serial_with_another_key_is_ekeyrejected(
    tmp_path: Path, modules: dict[str, Path], target: Target
) -> None:
    """A forged certificate with the real signer's issuer and serial finds the key id, then fails."""
    real = make_key(tmp_path / "real", "rsa2048", cn="vendor", serial=1001)
    forged = make_key(tmp_path / "forged", "rsa2048", cn="vendor", serial=1001)
    signed = sign(modules["ms_params"], real, tmp_path / "m.ko")
    verdict = check(signed, TrustStore.from_der(forged.cert_der.read_bytes()), target)
    assert (verdict.reason or "").startswith("EKEYREJECTED: signature does not match the module")


def test_grafted_trailer_of_another_module_is_ekeyrejected(
    tmp_path: Path, modules: dict[str, Path], signed_ec: Path, trust: TrustStore, target: Target
) -> None:
    """A valid signature of ms_params pasted onto ms_enodev does not verify."""
    data = graft(signed_ec.read_bytes(), append_signature(modules["ms_enodev"].read_bytes(), b"x"))
    verdict = check(file_with(tmp_path, data), trust, target)
    assert (verdict.reason or "").startswith("EKEYREJECTED: signature does not match the module")
    assert verdict.name == "ms_enodev"


@pytest.mark.parametrize(
    ("hash_", "attributes", "expected"),
    [
        ("sha256", True, "EKEYREJECTED: signed attribute smimeCapabilites outside Authenticode"),
        ("sha1", False, "ENOPKG (policy): sha1 signatures are refused by modstage"),
    ],
)
def test_openssl_cms_variants_are_rejected(
    tmp_path: Path,
    modules: dict[str, Path],
    rsa_key: SigningKey,
    trust: TrustStore,
    target: Target,
    hash_: str,
    attributes: bool,
    expected: str,
) -> None:
    """OpenSSL's signed attributes carry S/MIME capabilities: the parser's EKEYREJECTED;
    SHA-1, which 6.1 takes, is refused by policy."""
    signed = cms_sign(
        modules["ms_params"], rsa_key, tmp_path / "m.ko", hash=hash_, attributes=attributes
    )
    verdict = check(signed, trust, target)
    assert verdict.reason is not None and verdict.reason.startswith(expected)


def test_vermagic_for_another_kernel_is_enoexec(
    signed_rsa: Path, trust: TrustStore, target: Target
) -> None:
    """A module for another release passes same_magic (modversions): with the target's
    exports known, its CRCs decide, as the kernel's; without them it is refused by policy."""
    assert target.vermagic is not None
    other = replace(
        target,
        release="6.1.0-99-amd64",
        vermagic=target.vermagic.replace(target.release, "6.1.0-99-amd64"),
    )
    assert check(signed_rsa, trust, other).ok
    blind = replace(other, exports=other.exports.probe_only(), strict_crcs=True)
    verdict = check(signed_rsa, trust, blind)
    assert verdict.reason is not None and verdict.reason.startswith(
        "ENOEXEC (policy): vermagic is for kernel"
    )
    assert verdict.policy and verdict.errno == "ENOEXEC"
    assert verdict.signer == "modstage rsa"


def test_signature_is_checked_before_vermagic(modules: dict[str, Path], trust: TrustStore) -> None:
    """Kernel order: an unsigned module for another kernel reports the signature first."""
    verdict = check(modules["ms_params"], trust, "5.10.0-1-amd64")
    assert verdict.reason is not None and verdict.reason.startswith("ENODATA")


def test_signed_non_elf_is_enoexec(
    tmp_path: Path, rsa_key: SigningKey, trust: TrustStore, target: Target
) -> None:
    """A good signature over something that is not an ELF module is still refused."""
    text = file_with(tmp_path, b"#!/bin/sh\necho not a module\n" * 20, "text")
    verdict = check(sign(text, rsa_key, tmp_path / "m.ko"), trust, target)
    assert verdict.reason == "ENOEXEC: not an ELF file" and verdict.signer == "modstage rsa"


def test_signed_elf_without_modinfo_is_enoexec(
    tmp_path: Path, modules: dict[str, Path], rsa_key: SigningKey, trust: TrustStore, target: Target
) -> None:
    """No .modinfo means no vermagic: 6.1 with MODULE_FORCE_LOAD=y force-loads, modstage refuses."""
    data = modules["ms_params"].read_bytes().replace(b".modinfo\0", b".modinfX\0")
    signed = sign(file_with(tmp_path, data, "raw.ko"), rsa_key, tmp_path / "m.ko")
    verdict = check(signed, trust, target)
    assert verdict.reason is not None
    assert verdict.reason.startswith("ENOEXEC (policy): no vermagic in .modinfo; the target")
    assert verdict.policy


def test_bytes_after_the_content_info_are_ignored_as_the_kernel_does(
    tmp_path: Path, signed_rsa: Path, trust: TrustStore, target: Target
) -> None:
    """6.1's BER decoder stops after the top-level element: trailing bytes are not an error."""
    data = split(signed_rsa.read_bytes())
    verdict = check(file_with(tmp_path, data.with_(blob=data.blob + b"\0junk")), trust, target)
    assert verdict.ok, verdict.reason


def test_write_exec_section_is_enoexec_with_strict_module_rwx(
    tmp_path: Path, modules: dict[str, Path], rsa_key: SigningKey, trust: TrustStore, target: Target
) -> None:
    """A signed module with a W+X section: ENOEXEC from module_enforce_rwx_sections."""
    from tests.service.test_modinfo import section_index, set_field

    data = modules["ms_params"].read_bytes()
    wx = set_field(data, section_index(data, b".data"), "flags", 0x7)
    signed = sign(file_with(tmp_path, wx, "raw.ko"), rsa_key, tmp_path / "m.ko")
    verdict = check(signed, trust, target)
    assert verdict.reason == "ENOEXEC: section .data is writable and executable (STRICT_MODULE_RWX)"


def test_module_named_like_a_built_in_is_refused(
    signed_rsa: Path, trust: TrustStore, target: Target
) -> None:
    """mod_sysfs_init refuses (EINVAL) a name built-in code has under /sys/module. Read from
    the running kernel's /sys/module, that list is the whole answer: a listed name is refused
    as the kernel refuses it (not policy), and a modules.builtin name it does not list is
    accepted. This target has neither /sys/module nor an image: a modules.builtin name is
    refused as policy, and any other name is accepted."""
    builtin = replace(target, builtin=frozenset({"ms_params"}))
    verdict = check(signed_rsa, trust, builtin)
    assert (verdict.errno, verdict.policy) == ("EINVAL", True)
    assert verdict.reason is not None and "built into the target kernel" in verdict.reason
    assert check(signed_rsa, trust, target).ok
    running = replace(target, builtin_sysfs=frozenset({"ms_params", "kfence"}))
    verdict = check(signed_rsa, trust, running)
    assert (verdict.errno, verdict.policy) == ("EINVAL", False)
    assert verdict.reason is not None and "running kernel's /sys/module" in verdict.reason
    assert check(signed_rsa, trust, replace(builtin, builtin_sysfs=frozenset({"kfence"}))).ok


def _with_crc(data: bytes, symbol: bytes, crc: int) -> bytes:
    """``data`` with ``symbol``'s CRC in __versions replaced (entries: u64 crc, name[56])."""
    at = data.index(symbol + b"\0") - 8
    return data[:at] + crc.to_bytes(8, "little") + data[at + 8 :]


def test_symbol_crcs_the_target_exports_are_checked(
    tmp_path: Path, modules: dict[str, Path], rsa_key: SigningKey, trust: TrustStore, target: Target
) -> None:
    """check_modstruct_version: a wrong module_layout CRC is ENOEXEC (before vermagic);
    resolve_symbol: a wrong CRC of another known export is EINVAL, naming its owner."""
    assert "module_layout" in target.exports, target.exports.describe()
    data = modules["ms_params"].read_bytes()
    layout = sign(
        file_with(tmp_path, _with_crc(data, b"module_layout", 1), "a.ko"),
        rsa_key,
        tmp_path / "l.ko",
    )
    verdict = check(layout, trust, target)
    assert (verdict.errno, verdict.policy) == ("ENOEXEC", False)
    assert verdict.reason is not None and "version of symbol module_layout" in verdict.reason
    symbol = next(n for n in ("param_ops_int", "_printk") if n.encode() + b"\0" in data)
    other = sign(
        file_with(tmp_path, _with_crc(data, symbol.encode(), 2), "b.ko"), rsa_key, tmp_path / "o.ko"
    )
    verdict = check(other, trust, target)
    assert verdict.errno == "EINVAL" and f"version of symbol {symbol}" in (verdict.reason or "")
    assert "vmlinux" in (verdict.reason or "")


def test_target_notes_say_where_the_exports_came_from(target: Target) -> None:
    """The notes name the source of every export; only probed CRCs are said to be partial."""
    (note,) = target.notes()
    assert note == f"symbols: {target.exports.describe()}" and "Module.symvers" in note
    partial = replace(target, exports=target.exports.probe_only(), strict_crcs=True)
    (note,) = partial.notes()
    assert note.startswith("symbols: only the ") and "CRCs of the probed in-tree module" in note
    assert note.endswith("a module importing another symbol is refused (policy)")


def test_unknown_exports_are_refused_by_policy_except_at_boot(
    signed_rsa: Path, trust: TrustStore, target: Target
) -> None:
    """With none of the target's exports readable, a module importing a symbol not probed
    could be ENOENT or EINVAL at load, so verify and intake refuse it (policy); boot
    (probe_only, strict_crcs=False) leaves it to the kernel, as intake judged the kernel."""
    minimal = replace(target, exports=target.exports.probe_only(), strict_crcs=True)
    verdict = check(signed_rsa, trust, minimal)
    assert (verdict.errno, verdict.policy) == ("EINVAL", True), verdict.reason
    assert "not among the target's known exports" in (verdict.reason or "")
    assert check(signed_rsa, trust, target.probe_only()).ok


def test_the_running_kernels_sys_module_names_built_in_code_only(tmp_path: Path) -> None:
    """When the target is the running kernel, the built-in names are its /sys/module entries
    without `initstate` (which only a loaded module has): a live module's name is not taken
    for a built-in's, nor a file of the module kset (6.12's `compression`), and a target
    that is not the running kernel reads none from /sys."""
    from service.layout import Layout
    from service.verify.targetkernel.kernel import Target

    root = tmp_path / "root"
    for name, loaded in (("kfence", False), ("block", False), ("nvidia", True)):
        (root / "sys/module" / name).mkdir(parents=True)
        if loaded:
            (root / "sys/module" / name / "initstate").write_text("live\n")
    (root / "sys/module/compression").write_text("xz\n")  # 6.12's kset attribute, a file
    running = Target.from_layout(running_host(root, "6.12.117+deb13-amd64", boot_id=None))
    assert running.builtin_sysfs == frozenset({"kfence", "block"})
    assert running.sysfs_names() == (
        frozenset({"kfence", "block"}),
        "the running kernel's /sys/module",
    )
    other = Target.from_layout(Layout(root), "7.2.13+deb14-amd64")
    assert other.builtin_sysfs is None

"""The signature parsers follow the target kernel's version: from 6.7 they know SHA-3 and no
longer MD4 or MD5, from 6.11 no longer SM2 (the releases of the upstream commits)."""

from __future__ import annotations

import errno
from pathlib import Path

import pytest

from service.verify.signature.asn1 import Asn1Error
from service.verify.signature.pkcs7 import digests, parse_message
from service.verify.signature.x509 import parse_certificate, sig_algos
from service.verify.targetkernel.rules import KernelRules
from tests.kmod import SigningKey, sign, split

EVERY = frozenset({"md5", "sha256", "sha3_256", "sha3_384", "sha3_512"})


def blob(module: Path, key: SigningKey, out: Path, hash: str) -> bytes:
    """The PKCS#7 blob sign-file appends with digest ``hash``."""
    return split(sign(module, key, out, hash=hash).read_bytes()).blob


@pytest.mark.parametrize("hash", ["sha3-256", "sha3-384", "sha3-512"])
def test_sha3_digests_parse_on_6_12_and_are_unknown_to_6_1(
    modules: dict[str, Path], rsa_key: SigningKey, tmp_path: Path, hash: str
) -> None:
    """6.12's pkcs7_parser.c names the SHA-3 digests (since 6.7); 6.1's refuses the OID
    with ENOPKG, so the same module is judged differently by the two kernels."""
    data = blob(modules["ms_params"], rsa_key, tmp_path / "m.ko", hash)
    msg = parse_message(data, rules=KernelRules.parser((6, 12), EVERY, ecdsa=True))
    assert msg.signers[0].hash_algo == hash.replace("-", "_")
    with pytest.raises(Asn1Error) as info:
        parse_message(data, rules=KernelRules.parser((6, 1), EVERY, ecdsa=True))
    assert info.value.code == errno.ENOPKG


def test_md5_is_known_to_6_1_and_refused_by_6_12(
    modules: dict[str, Path], rsa_key: SigningKey, tmp_path: Path
) -> None:
    """6.1 parses an MD5 SignerInfo (and skips it when it cannot compute MD5); 6.12's parser
    no longer knows MD5: ENOPKG for the whole message."""
    data = blob(modules["ms_params"], rsa_key, tmp_path / "m.ko", "md5")
    assert parse_message(data, rules=KernelRules.parser((6, 1), EVERY, ecdsa=True)).signers
    with pytest.raises(Asn1Error) as info:
        parse_message(data, rules=KernelRules.parser((6, 12), EVERY, ecdsa=True))
    assert info.value.code == errno.ENOPKG


def test_a_certificate_parses_the_same_under_both_and_each_change_has_its_release(
    rsa_key: SigningKey,
) -> None:
    """An RSA/SHA-256 certificate gets the same kernel key id under either parser. Each
    change takes effect at the release of its upstream commit: SHA-3 and the end of MD4/MD5
    at 6.7 (6.6 is still 6.1's dialect), SM2's end at 6.11 (6.10 still names it)."""
    der = rsa_key.cert_der.read_bytes()
    old = parse_certificate(der, rules=KernelRules.parser((6, 1), EVERY, ecdsa=True))
    new = parse_certificate(der, rules=KernelRules.parser((6, 12), EVERY, ecdsa=True))
    assert (old.id, old.skid, old.subject) == (new.id, new.skid, new.subject)
    sha3 = [
        ("sha3_256" in digests(KernelRules.parser(v)), "md5" in digests(KernelRules.parser(v)))
        for v in ((6, 6), (6, 7), (7, 2))
    ]
    assert sha3 == [(False, True), (True, False), (True, False)]
    sm2 = [
        "SM2_with_SM3" in sig_algos(KernelRules.parser(v))
        for v in ((6, 1), (6, 10), (6, 11), (6, 12))
    ]
    assert sm2 == [True, True, False, False]


def _elf_cases(ko: bytes) -> dict[str, bytes]:
    from tests.oracle import elf

    modinfo_name = int(elf.sections(ko)[elf.index_of(ko, ".modinfo")]["name"])
    return {
        "a second, unallocated .modinfo": elf.set_section(ko, ".comment", name=modinfo_name),
        "the name table as PROGBITS": elf.set_section(ko, ".shstrtab", type=1),
    }


def test_what_6_12s_elf_validation_adds_is_refused_only_on_6_12(modules: dict[str, Path]) -> None:
    """Debian's 6.12 validates the ELF as 6.13 does (``elf_validity_cache_copy``): a second
    ``.modinfo`` or a name table that is not SHT_STRTAB is ENOEXEC there, and nothing to
    6.1; an unedited module has no such problem."""
    from service.errors import ModuleRejected
    from service.verify.loadrules import load_rules
    from service.verify.modfile.modinfo import ModInfo
    from service.verify.targetkernel.kernel import Target

    ko = modules["ms_params"].read_bytes()
    assert ModInfo.from_bytes(ko).elf_strict is None
    for what, edited in _elf_cases(ko).items():
        info = ModInfo.from_bytes(edited)
        assert info.elf_strict is not None, what
        new = Target.from_spec("6.12.117+deb13-amd64")
        with pytest.raises(ModuleRejected) as refused:
            load_rules(info, new)
        assert refused.value.refusal.errno == "ENOEXEC", what
        assert "6.12's ELF validation" in refused.value.reason
        old = Target.from_spec("6.1.0-57-amd64")
        try:
            load_rules(info, old)
        except ModuleRejected as exc:
            assert "6.12's ELF validation" not in str(exc), what


def test_a_this_module_of_the_wrong_size_is_the_kernels_enoexec_on_6_12(
    modules: dict[str, Path],
) -> None:
    """6.12 (as every kernel from 6.4, test_loadrules.py) checks .gnu.linkonce.this_module
    against sizeof(struct module) (ENOEXEC, its own refusal); 6.1 does not and may crash, so
    there it is modstage's named safety policy; the right size is no refusal of either."""
    from dataclasses import replace

    from service.errors import ModuleRejected
    from service.verify.loadrules import load_rules
    from service.verify.modfile.modinfo import ModInfo
    from service.verify.targetkernel.kernel import Target

    info = ModInfo.from_bytes(modules["ms_params"].read_bytes())
    assert info.this_module_size == 896
    said = ".gnu.linkonce.this_module is 896 bytes, not sizeof(struct module) = 904"
    for release, kernel_says in (("6.12.117+deb13-amd64", True), ("6.1.0-57-amd64", False)):
        target = Target.from_spec(release)
        with pytest.raises(ModuleRejected) as refused:
            load_rules(info, replace(target, struct_module=904))
        refusal = refused.value.refusal
        assert (refusal.errno, refusal.policy) == ("ENOEXEC", not kernel_says), release
        assert said in refusal.message and ("safety: " in refusal.message) != kernel_says
        with pytest.raises(ModuleRejected) as other:  # the vermagic, checked after the size
            load_rules(info, replace(target, struct_module=896))
        assert "this_module" not in other.value.reason, release

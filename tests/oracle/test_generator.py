"""The oracle's generator and CMS builder, without a VM."""

from __future__ import annotations

import hashlib
import re
from collections import Counter
from pathlib import Path
from typing import NamedTuple

import pytest

from tests.kmod.build import HEADERS, kernel_release
from tests.kmod.forge import MARKER, split
from tests.oracle import elf
from tests.oracle.cases import (
    CATEGORIES,
    GPL_ONLY,
    IMPORT_NS,
    LICENSE,
    NAMESPACED,
    NORMAL,
    NOT_GPL,
    OTHER_NS,
    SEED,
    UNEXPORTED,
    WEAK,
    WEAK_UNEXPORTED,
    generate,
    randomized,
    symbols,
    trailer,
)
from tests.oracle.cms import Cms, Signer, build
from tests.oracle.module import base_module, module_name, renamed
from tests.oracle.pki import Pki, load_pki
from tests.oracle.testbed import sign_file


@pytest.fixture(scope="module")
def pki() -> Pki:
    """The oracle's cached keys."""
    return load_pki()


def _digest(cases: list) -> str:  # type: ignore[type-arg]
    return hashlib.sha256(b"".join(c.id.encode() + c.data for c in cases)).hexdigest()


def test_generator_is_reproducible_and_large(pki: Pki, tmp_path: Path) -> None:
    """The same seed gives the same cases byte for byte; another seed changes the random
    ones; there are >= 300 cases in every category, each with its own module name."""
    first = generate(pki, tmp_path / "a", SEED)
    assert _digest(first) == _digest(generate(pki, tmp_path / "b", SEED))
    seeded = (trailer, randomized)
    other = generate(pki, tmp_path / "c", SEED + 1, seeded)
    assert _digest(other) != _digest(generate(pki, tmp_path / "d", SEED, seeded))
    assert len(first) >= 300
    assert len({c.name for c in first}) == len(first) == len({c.id for c in first})
    counts = Counter(c.category for c in first)
    expected = {"baseline", "ecdsa", "keys", "signers", "pkcs7", "trailer", "elf", "modinfo",
                "compress", "random", "symbols"}  # fmt: skip
    assert set(counts) == expected and len(CATEGORIES) == len(expected) + 2
    for case in first:
        renamed_on_purpose = "name-of-" in case.id or "tiny" in case.id
        renamed_on_purpose |= case.compressed != "" or case.suffix != ".ko"
        assert module_name(int(case.name[-5:])).encode() in case.data or renamed_on_purpose


def test_builder_reproduces_sign_file(pki: Pki, tmp_path: Path) -> None:
    """With default knobs the CMS builder emits exactly sign-file's PKCS#7 (issuer and SKID)."""
    payload = renamed(base_module(), 1)
    for skid in (False, True):
        made = sign_file(payload, pki["rsa3072"], tmp_path / "m.ko", "sha384", skid)
        signer = Signer(pki["rsa3072"], digest="sha384", sid="skid" if skid else "issuer")
        assert build(Cms((signer,)), payload) == split(made).blob


class Export(NamedTuple):
    """One line of Module.symvers."""

    crc: int
    owner: str
    kind: str
    namespace: str


@pytest.fixture(scope="module")
def exports() -> dict[bytes, Export]:
    """The target's exports, from the headers' Module.symvers: name -> Export."""
    text = (HEADERS / f"linux-headers-{kernel_release()}/Module.symvers").read_text()
    out = {}
    for line in text.splitlines():
        crc, name, owner, kind, namespace = line.split("\t")
        out[name.encode()] = Export(int(crc, 16), owner, kind, namespace)
    return out


@pytest.fixture(scope="module")
def payloads(pki: Pki, tmp_path_factory: pytest.TempPathFactory) -> dict[str, bytes]:
    """The symbols cases' signed payloads: label -> ELF (the signature split off)."""
    cases = generate(pki, tmp_path_factory.mktemp("symbols"), SEED, (symbols,))
    assert all(c.data.endswith(MARKER) and c.category == "symbols" for c in cases)
    return {c.id.removeprefix("symbols/"): split(c.data).payload for c in cases}


def _unnamed(payload: bytes) -> bytes:
    return re.sub(rb"msorc_\d{5}", module_name(0).encode(), payload)


def _modinfo(payload: bytes) -> list[bytes]:
    offset, size = elf.section_data(payload, ".modinfo")
    return [entry for entry in payload[offset : offset + size].split(b"\0") if entry]


def test_symbols_control_imports_each_kind_of_vmlinux_export(
    payloads: dict[str, bytes], exports: dict[bytes, Export]
) -> None:
    """The control imports a normal, a GPL-only, a namespaced (with its import_ns) and a weak
    vmlinux export, each listed in __versions with the target's CRC, under a GPL license."""
    control = payloads["control"]
    imports, versions = elf.undefined_symbols(control), elf.versions(control)
    assert imports[NORMAL] == imports[GPL_ONLY] == imports[NAMESPACED] == elf.STB_GLOBAL
    assert imports[WEAK] == elf.STB_WEAK
    for name in (NORMAL, b"jiffies", GPL_ONLY, NAMESPACED, WEAK):
        assert exports[name].owner == "vmlinux" and versions[name] == exports[name].crc
    assert exports[NORMAL].kind == exports[WEAK].kind == "EXPORT_SYMBOL"
    assert exports[GPL_ONLY].kind == exports[NAMESPACED].kind == "EXPORT_SYMBOL_GPL"
    assert exports[GPL_ONLY].namespace == "" and exports[NAMESPACED].namespace == "DMA_BUF"
    assert IMPORT_NS.rstrip(b"\0") in _modinfo(control)
    assert LICENSE.rstrip(b"\0") in _modinfo(control)


def test_unknown_symbol_cases_import_what_nobody_exports(
    payloads: dict[str, bytes], exports: dict[bytes, Export]
) -> None:
    """unknown-symbol and unknown-weak-symbol import, with global and weak binding, a name no
    export has, which also took the old name's place in __versions (so only the lookup
    fails); unknown-symbol-not-in-versions renames the import alone, leaving the new name
    without a __versions entry and the old one's in place."""
    assert UNEXPORTED not in exports and WEAK_UNEXPORTED not in exports
    control = elf.versions(payloads["control"])
    for label, old, new, bind in (
        ("unknown-symbol", NORMAL, UNEXPORTED, elf.STB_GLOBAL),
        ("unknown-symbol-not-in-versions", NORMAL, UNEXPORTED, elf.STB_GLOBAL),
        ("unknown-weak-symbol", WEAK, WEAK_UNEXPORTED, elf.STB_WEAK),
    ):
        payload = payloads[label]
        imports, versions = elf.undefined_symbols(payload), elf.versions(payload)
        assert imports.get(new) == bind and old not in imports, label
        if label.endswith("not-in-versions"):
            assert new not in versions and versions[old] == control[old], label
        else:
            assert old not in versions and versions[new] == control[old], label


def test_missing_from_versions_keeps_the_import_but_not_its_crc(
    payloads: dict[str, bytes],
) -> None:
    """missing-from-versions still imports _printk while __versions (present, other entries
    intact) has no entry for it."""
    payload, control = payloads["missing-from-versions"], payloads["control"]
    assert NORMAL in elf.undefined_symbols(payload) and NORMAL not in elf.versions(payload)
    assert len(elf.versions(payload)) == len(elf.versions(control))


def test_non_gpl_cases_differ_from_their_control_in_the_license_only(
    payloads: dict[str, bytes], exports: dict[bytes, Export]
) -> None:
    """gpl-only-from-non-gpl is the control under license=BSD (still importing GPL-only
    symbols); non-gpl-without-gpl-imports is the base module under license=BSD and imports no
    GPL-only symbol."""
    relicensed = payloads["gpl-only-from-non-gpl"]
    assert _unnamed(relicensed) == _unnamed(payloads["control"]).replace(LICENSE, NOT_GPL)
    assert NOT_GPL.rstrip(b"\0") in _modinfo(relicensed)
    assert LICENSE.rstrip(b"\0") not in _modinfo(relicensed)
    plain = payloads["non-gpl-without-gpl-imports"]
    assert NOT_GPL.rstrip(b"\0") in _modinfo(plain)
    assert {exports[name].kind for name in elf.undefined_symbols(plain)} == {"EXPORT_SYMBOL"}


def test_namespace_not_imported_imports_another_real_namespace(
    payloads: dict[str, bytes], exports: dict[bytes, Export]
) -> None:
    """namespace-not-imported imports IIO_HID (a namespace that exists) instead of DMA_BUF,
    the namespace of its import dma_buf_put."""
    info = _modinfo(payloads["namespace-not-imported"])
    assert OTHER_NS.rstrip(b"\0") in info and IMPORT_NS.rstrip(b"\0") not in info
    namespace = OTHER_NS.rstrip(b"\0").split(b"=")[1].decode()
    assert any(e.namespace == namespace for e in exports.values())
    assert NAMESPACED in elf.undefined_symbols(payloads["namespace-not-imported"])


def test_crc_cases_change_exactly_one_crc(
    payloads: dict[str, bytes], exports: dict[bytes, Export]
) -> None:
    """crc-gpl-symbol, crc-namespaced-symbol and crc-weak-symbol differ from the target's
    CRC in the one entry of their import, all others matching."""
    for label, name in (
        ("crc-gpl-symbol", GPL_ONLY),
        ("crc-namespaced-symbol", NAMESPACED),
        ("crc-weak-symbol", WEAK),
    ):
        versions = elf.versions(payloads[label])
        wrong = {s for s, crc in versions.items() if crc != exports[s].crc}
        assert wrong == {name}, label

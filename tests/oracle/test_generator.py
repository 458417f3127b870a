"""The oracle's generator and CMS builder, without a VM."""

from __future__ import annotations

import hashlib
from collections import Counter
from pathlib import Path

import pytest

from tests.kmod.forge import split
from tests.oracle.cases import CATEGORIES, SEED, generate, randomized, trailer
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
                "compress", "random"}  # fmt: skip
    assert set(counts) == expected and len(CATEGORIES) == len(expected) + 2
    for case in first:
        renamed_on_purpose = "builtin" in case.id or "tiny" in case.id
        renamed_on_purpose |= case.compressed != "" or case.suffix != ".ko"
        assert module_name(int(case.name[-5:])).encode() in case.data or renamed_on_purpose


def test_builder_reproduces_sign_file(pki: Pki, tmp_path: Path) -> None:
    """With default knobs the CMS builder emits exactly sign-file's PKCS#7 (issuer and SKID)."""
    payload = renamed(base_module(), 1)
    for skid in (False, True):
        made = sign_file(payload, pki["rsa3072"], tmp_path / "m.ko", "sha384", skid)
        signer = Signer(pki["rsa3072"], digest="sha384", sid="skid" if skid else "issuer")
        assert build(Cms((signer,)), payload) == split(made).blob

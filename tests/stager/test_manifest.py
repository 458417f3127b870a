"""Manifest values: round trip, canonical digest, tomllib compatibility."""

from __future__ import annotations

import random
import tomllib
from pathlib import Path

import pytest
import tomli_w
from hypothesis import given
from hypothesis import strategies as st

from stager.schema.failures import ManifestError
from stager.schema.manifest import MAX_MANIFEST_BYTES, Manifest, ModuleEntry
from tests.strategies import manifests


@given(manifests())
def test_round_trip(manifest: Manifest) -> None:
    """Any valid manifest survives to_toml/from_toml unchanged."""
    assert Manifest.from_toml(manifest.to_toml()) == manifest


@given(manifests(), st.randoms(use_true_random=False))
def test_digest_ignores_key_order_and_whitespace(manifest: Manifest, rnd: random.Random) -> None:
    """The canonical digest is the same however the TOML was laid out."""
    table = manifest.to_dict()

    def shuffled(value: object) -> object:
        if isinstance(value, dict):
            items = list(value.items())
            rnd.shuffle(items)
            return {k: shuffled(v) for k, v in items}
        if isinstance(value, list):
            return [shuffled(v) for v in value]
        return value

    text = tomli_w.dumps(shuffled(table))  # type: ignore[arg-type]
    noisy = "# written by a container\n\n" + text.replace(" = ", "   =\t").replace("\n", "\n\n")
    reparsed = Manifest.from_toml(noisy)
    assert reparsed == manifest
    assert reparsed.digest == manifest.digest


@given(manifests(), manifests())
def test_digest_tells_manifests_apart(a: Manifest, b: Manifest) -> None:
    """Different manifests have different digests (the generation id is unambiguous)."""
    assert (a.digest == b.digest) == (a == b)


@given(manifests())
def test_plain_tomllib_reads_the_canonical_form(manifest: Manifest) -> None:
    """The canonical bytes parse with plain tomllib into the documented table."""
    data = tomllib.loads(manifest.to_toml().decode())
    assert data["schema"] == 1
    assert [m["file"] for m in data["module"]] == [m.file for m in manifest.modules]
    assert [m["params"] for m in data["module"]] == [m.params for m in manifest.modules]


def test_module_names_follow_the_kernel_spelling() -> None:
    """A module's name drops its suffix and spells '-' as '_', as the kernel does."""
    m = Manifest.from_toml(
        'schema = 1\nbundle = "nvidia"\nversion = "1"\nkernel = "6.1"\n'
        '[[module]]\nfile = "modules/nvidia-uvm.ko.zst"\nsha256 = "' + "0" * 64 + '"\n'
    )
    assert m.modules[0].name == "nvidia_uvm"
    assert m.modules[0].params == ""


def test_read_takes_the_directory_manifest_and_bounds_it(tmp_path: Path) -> None:
    """``Manifest.read`` gives what was written; an oversized file is refused, naming it."""
    manifest = Manifest("b", "1", "6.1", (ModuleEntry("modules/m.ko", "0" * 64),))
    (tmp_path / "manifest.toml").write_bytes(manifest.to_toml())
    assert Manifest.read(tmp_path) == manifest
    (tmp_path / "manifest.toml").write_bytes(b"#" * (MAX_MANIFEST_BYTES + 10))
    with pytest.raises(ManifestError, match="larger than") as info:
        Manifest.read(tmp_path)
    assert info.value.source == str(tmp_path / "manifest.toml")

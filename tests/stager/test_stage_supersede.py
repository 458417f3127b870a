"""A finished drop supersedes the older drops of its bundle for its own kernel only."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from stager.drop import ModuleSpec, drop_kernel, stage
from stager.schema.manifest import MAX_MANIFEST_BYTES
from stager.schema.paths import MANIFEST_NAME, drop_name
from tests.stager.argv import module_bytes

X, Y = "6.1.0-57-amd64", "6.12.95+deb13-amd64"  # the running kernel, the next one


@pytest.fixture
def incoming(tmp_path: Path) -> Path:
    """An empty incoming directory beside one module file (``tmp_path/nvidia.ko``)."""
    (tmp_path / "nvidia.ko").write_bytes(module_bytes(512, b"nv"))
    (tmp_path / "incoming").mkdir()
    return tmp_path / "incoming"


def _stage(incoming: Path, kernel: str, version: str = "1", bundle: str = "nvidia") -> Path:
    module = [ModuleSpec(incoming.parent / "nvidia.ko")]
    return stage(incoming, bundle=bundle, version=version, kernel=kernel, modules=module)


def _planted(incoming: Path, nanos: int = 1) -> Path:
    """An older drop directory of ``nvidia`` without a manifest yet."""
    drop = incoming / drop_name("nvidia", nanos, "00")
    drop.mkdir()
    return drop


def test_a_drop_for_one_kernel_keeps_the_waiting_drop_for_another(incoming: Path) -> None:
    """The pre-stage pod's drop for Y still waits when the driver pod's drop for X arrives:
    Y's stays; the next drop for X removes the older X drop only, and one for Y then the
    older Y drop."""
    for_y = _stage(incoming, Y)
    for_x = _stage(incoming, X)
    assert sorted(incoming.iterdir()) == sorted([for_y, for_x])
    newer_x = _stage(incoming, X, version="2")
    assert sorted(incoming.iterdir()) == sorted([for_y, newer_x])
    newer_y = _stage(incoming, Y, version="2")
    assert sorted(incoming.iterdir()) == sorted([newer_x, newer_y])


def test_a_drop_whose_manifest_names_no_kernel_is_superseded(incoming: Path) -> None:
    """Older drops of the bundle that name no kernel go, whatever kernel the new drop is
    for: one without a manifest (a stager killed), one with garbage, one naming another
    bundle than its name; a drop of another bundle for the same kernel stays."""
    partial = _planted(incoming, 1)
    garbage = _planted(incoming, 2)
    (garbage / MANIFEST_NAME).write_bytes(b"schema = [")
    foreign = _planted(incoming, 3)
    other_bundle = _stage(incoming, X, bundle="mlnx")
    (foreign / MANIFEST_NAME).write_bytes((other_bundle / MANIFEST_NAME).read_bytes())
    assert drop_kernel(other_bundle) == X and drop_kernel(foreign) is None
    new = _stage(incoming, Y)
    assert sorted(incoming.iterdir()) == sorted([other_bundle, new])
    assert not partial.exists() and not garbage.exists() and not foreign.exists()


def test_the_older_drops_manifest_is_read_as_the_host_reads_it(
    incoming: Path, tmp_path: Path
) -> None:
    """A container's drop is hostile: a manifest that is a symlink (to a real manifest for
    Y), a FIFO (never opened: no hang), a hard link, or over the schema's byte bound names
    no kernel, and so does a drop directory that is a symlink (to a real drop for Y)."""
    (tmp_path / "elsewhere").mkdir()
    real = _stage(tmp_path / "elsewhere", Y)
    assert drop_kernel(real) == Y
    linked = _planted(incoming, 1)
    (linked / MANIFEST_NAME).symlink_to(real / MANIFEST_NAME)
    fifo = _planted(incoming, 2)
    os.mkfifo(fifo / MANIFEST_NAME)
    hard = _planted(incoming, 3)
    os.link(real / MANIFEST_NAME, hard / MANIFEST_NAME)
    huge = _planted(incoming, 4)
    body = (real / MANIFEST_NAME).read_bytes()
    (huge / MANIFEST_NAME).write_bytes(body + b"#" * (MAX_MANIFEST_BYTES - len(body) + 1))
    via = incoming / drop_name("nvidia", 5, "00")
    via.symlink_to(real, target_is_directory=True)
    assert [drop_kernel(d) for d in (linked, fifo, hard, huge, via)] == [None] * 5
    (huge / MANIFEST_NAME).write_bytes(body + b"#" * (MAX_MANIFEST_BYTES - len(body)))
    assert drop_kernel(huge) == Y  # at the bound exactly: read
    os.unlink(hard / MANIFEST_NAME)
    assert drop_kernel(real) == Y  # singly linked again


def test_an_older_drop_that_is_a_symlink_goes_and_what_it_leads_to_stays(
    incoming: Path, tmp_path: Path
) -> None:
    """An entry named as an older drop of the bundle that is a symlink to a directory with a
    manifest: the new drop removes the link itself, never the manifest it leads to."""
    (tmp_path / "elsewhere").mkdir()
    real = _stage(tmp_path / "elsewhere", X)
    via = incoming / drop_name("nvidia", 1, "00")
    via.symlink_to(real, target_is_directory=True)
    new = _stage(incoming, X, version="2")
    assert list(incoming.iterdir()) == [new]
    assert (real / MANIFEST_NAME).is_file() and drop_kernel(real) == X

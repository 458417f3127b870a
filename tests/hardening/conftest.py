"""Fixtures for the hardening tests: a host tree, canaries, tmpfs mounts.

The session fixtures (kbuild modules, sign-file keys, the signed modules), the host tree
factory and ``make_intake`` are the service tests' own.
"""

from __future__ import annotations

import os
import subprocess
from collections.abc import Callable, Iterator
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from service.config import BundlePolicy, Config
from service.layout import Layout
from stager.drop import ModuleSpec, stage
from tests.service import fakes
from tests.service.conftest import (
    HostTree,
    host_tree,
    kernel,
    keydir,
    modules,
    other_key,
    rsa_key,
    signed,
)

if TYPE_CHECKING:
    from service.intake.scan import Intake
    from service.verify.signature.keyring import Keyring

__all__ = [
    "host_tree",
    "kernel",
    "keydir",
    "make_intake",
    "modules",
    "other_key",
    "rsa_key",
    "signed",
]


#: the hardening drops carry firmware none of their modules declares (``fw/blob.bin`` beside
#: ms_exporter, thousands of ``dNN/fNNNNN.bin``): this host lets bundle ``test`` carry any
#: name (``[bundles.test] firmware = ["*"]``); the rule is tests/service/test_firmware_policy.py's
ANY_FIRMWARE = (("test", BundlePolicy(firmware=("*",))),)


def make_intake(
    layout: Layout, config: Config | None = None, keyring: Keyring | None = None
) -> Intake:
    """The service tests' intake (``fakes.make_intake``), with :data:`ANY_FIRMWARE` unless
    ``config`` has bundle tables of its own."""
    config = config or Config()
    return fakes.make_intake(
        layout, replace(config, bundles=config.bundles or ANY_FIRMWARE), keyring
    )


@pytest.fixture
def host(host_tree: HostTree) -> Layout:
    """A host tree whose running kernel is the test modules' kernel, one memory block offline."""
    return host_tree({0: "online", 1: "offline"})


@pytest.fixture
def firmware_dir(tmp_path: Path) -> Path:
    """A firmware source tree with one blob, staged as ``firmware/fw/blob.bin``."""
    root = tmp_path / "fwsrc"
    (root / "fw").mkdir(parents=True)
    (root / "fw/blob.bin").write_bytes(b"firmware blob " * 64)
    return root


def stage_drop(
    layout: Layout,
    kernel: str,
    files: list[Path],
    *,
    bundle: str = "test",
    version: str = "1",
    firmware: tuple[Path, ...] = (),
    params: str = "",
    **kw: object,
) -> Path:
    """A complete drop written by the real stager."""
    return stage(
        layout.incoming,
        bundle=bundle,
        version=version,
        kernel=kernel,
        modules=[ModuleSpec(f, params) for f in files],
        firmware_dirs=firmware,
        **kw,  # type: ignore[arg-type]
    )


@pytest.fixture
def tmpfs(tmp_path: Path) -> Iterator[Callable[[Path, str], Path]]:
    """Mount a tmpfs of a given size at a path (root only); unmounted afterwards."""
    mounted: list[Path] = []

    def mount(at: Path, size: str) -> Path:
        at.mkdir(parents=True, exist_ok=True)
        subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(at)], check=True)
        mounted.append(at)
        return at

    yield mount
    for at in reversed(mounted):
        subprocess.run(["umount", "-l", str(at)], check=False)


def chain(top: Path, depth: int, extra: bool = True) -> None:
    """A ``x/x/x…`` chain ``depth`` deep below ``top``, a file and a symlink at each level."""
    fd = os.open(top, os.O_RDONLY | os.O_DIRECTORY)
    try:
        for _ in range(depth):
            os.mkdir("x", dir_fd=fd)
            nxt = os.open("x", os.O_RDONLY | os.O_DIRECTORY, dir_fd=fd)
            os.close(fd)
            fd = nxt
            if extra:
                os.close(os.open("f", os.O_CREAT | os.O_WRONLY, 0o600, dir_fd=fd))
                os.symlink("/etc", "l", dir_fd=fd)
    finally:
        os.close(fd)

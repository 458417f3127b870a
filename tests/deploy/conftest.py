"""Fixtures of the builder's tests: small real modules built for this machine's Debian
kernel, keys, and a tiny base root file system (the builder takes any tar as its base)."""

from __future__ import annotations

import io
import tarfile
from pathlib import Path

import pytest

from tests.kmod import SigningKey, build_modules, cache_root, kernel_release, make_key


@pytest.fixture(scope="session")
def release() -> str:
    """This machine's Debian kernel: its headers, sign-file, image and in-tree modules."""
    return kernel_release()


@pytest.fixture(scope="session")
def build_cache() -> Path:
    """The builder's cache: the test cache, so the kernel target modstage verify reads
    (and its exports table) is laid out once per machine, as it is for tests/nvidia."""
    return cache_root()


@pytest.fixture(scope="session")
def key(tmp_path_factory: pytest.TempPathFactory) -> SigningKey:
    """The pool's signing key and certificate."""
    return make_key(tmp_path_factory.mktemp("key"), "rsa2048", cn="pool key", serial=4242)


@pytest.fixture(scope="session")
def other_key(tmp_path_factory: pytest.TempPathFactory) -> SigningKey:
    """Another key whose certificate has the same subject, issuer and serial as ``key``'s."""
    return make_key(tmp_path_factory.mktemp("other"), "rsa2048", cn="pool key", serial=4242)


def prebuilt(into: Path, release: str, names: list[str]) -> Path:
    """``into/<release>/<name>.ko``: small real modules built (unsigned) for ``release``,
    as ``build-image --prebuilt`` takes them. Returns ``into``."""
    built = build_modules()
    (into / release).mkdir(parents=True)
    for name in names:
        (into / release / f"{name}.ko").write_bytes(built[name].read_bytes())
    return into


@pytest.fixture(scope="session")
def base(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A base root file system tar of two files (the real one is Debian's, mmdebstrap)."""
    path = tmp_path_factory.mktemp("base") / "base.tar"
    with tarfile.open(path, "w") as tar:
        for name, data in (("etc/os-release", b"ID=debian\n"), ("bin/true", b"")):
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return path

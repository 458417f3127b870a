"""Fixtures for the verification tests: real modules, real keys, real signatures.

Keys and signed modules are session-scoped (RSA-4096 key generation costs a second);
every test that changes bytes works on its own copy under ``tmp_path``.
"""

from __future__ import annotations

import shutil
from collections.abc import Mapping
from pathlib import Path
from typing import Protocol

import pytest

from service.layout import Layout
from service.verify.signature.trust import TrustStore
from service.verify.targetkernel.kernel import Target
from tests.kmod import SigningKey, build_modules, install_target, kernel_release, make_key, sign
from tests.service.fakes import make_host


@pytest.fixture(scope="session")
def kernel() -> str:
    """The installed Debian kernel release the test modules are built for."""
    return kernel_release()


@pytest.fixture(scope="session")
def debian_target(kernel: str, tmp_path_factory: pytest.TempPathFactory) -> Target:
    """The installed Debian kernel as a target: its real vermagic and configuration."""
    root = install_target(tmp_path_factory.mktemp("debian-root"), kernel)
    return Target.from_layout(Layout(root), kernel)


@pytest.fixture(scope="session")
def target(kernel: str, tmp_path_factory: pytest.TempPathFactory) -> Target:
    """The Debian kernel built with ``CONFIG_CRYPTO_ECDSA=y``, so EC keys can be trusted."""
    root = install_target(
        tmp_path_factory.mktemp("ecdsa-root"), kernel, config_extra="CONFIG_CRYPTO_ECDSA=y\n"
    )
    return Target.from_layout(Layout(root), kernel)


@pytest.fixture(scope="session")
def modules() -> dict[str, Path]:
    """Unsigned test modules, built once with kbuild (cached on disk)."""
    return build_modules()


@pytest.fixture(scope="session")
def keydir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A directory for session-wide keys and signed modules."""
    return tmp_path_factory.mktemp("keys")


@pytest.fixture(scope="session")
def rsa_key(keydir: Path) -> SigningKey:
    """An RSA-4096 module signing key."""
    return make_key(keydir, "rsa4096", cn="modstage rsa")


@pytest.fixture(scope="session")
def ec_key(keydir: Path) -> SigningKey:
    """An ECDSA P-384 module signing key."""
    return make_key(keydir, "p384", cn="modstage ec")


@pytest.fixture(scope="session")
def other_key(keydir: Path) -> SigningKey:
    """An RSA-2048 key nobody trusts."""
    return make_key(keydir, "rsa2048", cn="untrusted")


@pytest.fixture(scope="session")
def trust(rsa_key: SigningKey, ec_key: SigningKey) -> TrustStore:
    """Trust in the RSA and the ECDSA key."""
    return TrustStore.from_der(rsa_key.cert_der.read_bytes(), ec_key.cert_der.read_bytes())


@pytest.fixture(scope="session")
def signed_rsa(modules: dict[str, Path], rsa_key: SigningKey, keydir: Path) -> Path:
    """ms_params signed by sign-file with RSA-4096/sha256, signer by issuer+serial."""
    return sign(modules["ms_params"], rsa_key, keydir / "rsa.ko")


@pytest.fixture(scope="session")
def signed_ec(modules: dict[str, Path], ec_key: SigningKey, keydir: Path) -> Path:
    """ms_params signed by sign-file -k with P-384/sha384, signer by SKID."""
    return sign(modules["ms_params"], ec_key, keydir / "ec.ko", hash="sha384", skid=True)


class HostTree(Protocol):
    """Builds the test's host tree: memory blocks as given, ``sig_enforce`` set if asked."""

    def __call__(
        self, blocks: Mapping[int, str] | None = None, *, enforcing: bool = False
    ) -> Layout:
        """A host tree under ``tmp_path / "root"`` (one per test)."""
        ...


@pytest.fixture
def host_tree(tmp_path: Path, kernel: str, rsa_key: SigningKey) -> HostTree:
    """Builds a host tree (``fakes.make_host``) trusting the RSA key, whose running kernel is
    the test modules' kernel: ``blocks`` its memory blocks (none by default), ``enforcing``
    writes ``Y`` to ``module.sig_enforce``. The one way test modules make their ``host``."""

    def build(blocks: Mapping[int, str] | None = None, *, enforcing: bool = False) -> Layout:
        layout = make_host(tmp_path / "root", kernel, rsa_key.cert_pem, dict(blocks or {}))
        if enforcing:
            layout.sig_enforce.parent.mkdir(parents=True)
            layout.sig_enforce.write_text("Y\n")
        return layout

    return build


@pytest.fixture
def host(host_tree: HostTree) -> Layout:
    """A host tree with memory blocks 0-1 online and 2-4 offline.

    A test module that needs another host defines its own ``host`` from ``host_tree``.
    """
    return host_tree({0: "online", 1: "online", 2: "offline", 3: "offline", 4: "offline"})


@pytest.fixture(scope="session")
def signed(
    modules: dict[str, Path], rsa_key: SigningKey, tmp_path_factory: pytest.TempPathFactory
) -> dict[str, Path]:
    """Every test module signed with the trusted RSA key, by module name (once per session:
    tests copy, never change, these files)."""
    out = tmp_path_factory.mktemp("signed")
    return {n: sign(p, rsa_key, out / f"{n}.ko") for n, p in modules.items()}


@pytest.fixture
def module(signed: dict[str, Path]) -> Path:
    """ms_params signed with the trusted key: the module a test stages when any one will do."""
    return signed["ms_params"]


@pytest.fixture(scope="session")
def vendor_key(tmp_path_factory: pytest.TempPathFactory) -> SigningKey:
    """A second vendor's RSA-2048 module signing key."""
    return make_key(tmp_path_factory.mktemp("vendor"), "rsa2048", cn="other vendor")


@pytest.fixture
def both(host: Layout, vendor_key: SigningKey) -> Layout:
    """The host trusting the session's RSA key and the second vendor's (``vendor.pem``)."""
    shutil.copy(vendor_key.cert_pem, host.trusted / "vendor.pem")
    return host

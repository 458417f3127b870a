"""Fixtures for the verification tests: real modules, real keys, real signatures.

Keys and signed modules are session-scoped (RSA-4096 key generation costs a second);
every test that changes bytes works on its own copy under ``tmp_path``.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from service.layout import Layout
from service.verify.signature.trust import TrustStore
from service.verify.target.kernel import Target
from tests.kmod import SigningKey, build_modules, install_target, kernel_release, make_key, sign


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


@pytest.fixture
def host(tmp_path: Path, kernel: str, rsa_key: SigningKey) -> Layout:
    """A host tree (``fakes.make_host``) with memory blocks 0-1 online and 2-4 offline.

    Test modules that need another host define their own ``host``.
    """
    from tests.service.fakes import make_host

    return make_host(
        tmp_path / "root",
        kernel,
        rsa_key.cert_pem,
        {0: "online", 1: "online", 2: "offline", 3: "offline", 4: "offline"},
    )


@pytest.fixture
def signed(modules: dict[str, Path], rsa_key: SigningKey, tmp_path: Path) -> dict[str, Path]:
    """All test modules signed with the trusted RSA key."""
    (tmp_path / "signed").mkdir()
    return {n: sign(p, rsa_key, tmp_path / "signed" / f"{n}.ko") for n, p in modules.items()}

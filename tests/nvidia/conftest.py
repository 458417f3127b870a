"""Fixtures of the real-driver tests: Debian's NVIDIA modules built, signed in the session.

The build is cached per machine (``tests.nvidia.build``); the signing key is made here, so
every run signs the modules afresh with the kernel's ``sign-file``. Every test in this
directory carries the ``nvidia`` marker (``-m "not nvidia"`` leaves them out; they are not
skipped when the archive is unreachable: they fail).
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from service.layout import Layout
from tests.kmod import SigningKey, make_key
from tests.nvidia import Driver, build_driver, install_real_target, sign_driver


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Mark every test collected from this directory ``nvidia``."""
    here = Path(__file__).parent
    for item in items:
        if here in Path(str(item.fspath)).parents:
            item.add_marker(pytest.mark.nvidia)


# The Debian versions of nvidia-kernel-source that build against Debian 12's 6.1 (both also
# build against Debian 13's 6.12; see README.md): bookworm's 535 and trixie's 550.
# nvidia-open-kernel-source (535 and 550) builds against neither: both kernels' stable
# updates gave pci_resize_resource() a fourth argument, which the open modules' nv-pci.c
# (nv_resize_pcie_bars) does not pass.
VERSIONS = ("535.261.03-1", "550.163.01-2")


@pytest.fixture(scope="session", params=VERSIONS, ids=lambda v: v.split(".", 1)[0])
def driver(request: pytest.FixtureRequest) -> Driver:
    """nvidia-kernel-source of each version built against the test kernel (cached on disk)."""
    return build_driver(request.param)


@pytest.fixture(scope="session")
def nvidia_key(tmp_path_factory: pytest.TempPathFactory) -> SigningKey:
    """An RSA-4096 module signing key made for this session."""
    return make_key(tmp_path_factory.mktemp("nvidia-key"), "rsa4096", cn="modstage nvidia")


@pytest.fixture(scope="session")
def signed(
    driver: Driver, nvidia_key: SigningKey, tmp_path_factory: pytest.TempPathFactory
) -> dict[str, Path]:
    """Every module of the driver signed by ``sign-file`` with the session's key."""
    return sign_driver(driver, nvidia_key, tmp_path_factory.mktemp("nvidia-signed"))


@pytest.fixture(scope="session")
def firmware(driver: Driver) -> Path:
    """The GSP firmware of the driver's version: ``nvidia/<version>/gsp_*.bin`` below it."""
    return driver.firmware


@pytest.fixture(scope="session")
def real_host(
    driver: Driver, nvidia_key: SigningKey, tmp_path_factory: pytest.TempPathFactory
) -> Layout:
    """A host root whose target is this machine's Debian kernel, whole (vmlinuz, in-tree
    modules), with the session's key trusted. One per driver: the exports table modstage
    builds from those files costs tens of seconds and is cached under the root's paths."""
    release = driver.kernel
    layout = Layout(tmp_path_factory.mktemp("nvidia-host"))
    layout.trusted.mkdir(parents=True)
    shutil.copy(nvidia_key.cert_pem, layout.trusted / "nvidia.pem")
    (layout.proc / "sys/kernel/random").mkdir(parents=True)
    layout.os_release.write_text(release + "\n")
    layout.boot_id.write_text("11111111-2222-3333-4444-555555555555\n")
    layout.incoming.mkdir(parents=True)
    return Layout(install_real_target(layout.root, release))

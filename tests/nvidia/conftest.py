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
from tests.nvidia import RELEASE_DRIVER, Driver, driver_for, install_real_target, sign_driver
from tests.vm.harness.kernel import Kernel


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Mark every test collected from this directory ``nvidia``."""
    here = Path(__file__).parent
    for item in items:
        if here in Path(str(item.fspath)).parents:
            item.add_marker(pytest.mark.nvidia)


# Each Debian release's own driver against its own kernel (tests.nvidia.RELEASE_DRIVER):
# bookworm's 535 against Debian 12's 6.1 (this machine's headers) and trixie's 550 against
# Debian 13's 6.12 (built in the Debian 13 test root). README.md records which other pairs
# build (550 against 6.1 and 535 against 6.12 do; the open modules build on neither).
SERIES = ("6.1", "6.12")


@pytest.fixture(scope="session", params=SERIES, ids=lambda s: f"{RELEASE_DRIVER[s][:3]}-{s}")
def driver_kernel(request: pytest.FixtureRequest) -> Kernel:
    """The kernel the driver is built for and its files are read from."""
    return Kernel.named(request.param)


@pytest.fixture(scope="session")
def driver(driver_kernel: Kernel) -> Driver:
    """The kernel's own release's nvidia-kernel-source built against it (cached on disk)."""
    return driver_for(driver_kernel)


@pytest.fixture(scope="session")
def nvidia_key(tmp_path_factory: pytest.TempPathFactory) -> SigningKey:
    """An RSA-4096 module signing key made for this session."""
    return make_key(tmp_path_factory.mktemp("nvidia-key"), "rsa4096", cn="modstage nvidia")


@pytest.fixture(scope="session")
def signed(
    driver: Driver,
    driver_kernel: Kernel,
    nvidia_key: SigningKey,
    tmp_path_factory: pytest.TempPathFactory,
) -> dict[str, Path]:
    """Every module of the driver signed by the kernel's ``sign-file`` with the session's key."""
    directory = tmp_path_factory.mktemp("nvidia-signed")
    return sign_driver(driver, nvidia_key, directory, driver_kernel)


@pytest.fixture(scope="session")
def firmware(driver: Driver) -> Path:
    """The GSP firmware of the driver's version: ``nvidia/<version>/gsp_*.bin`` below it."""
    return driver.firmware


@pytest.fixture(scope="session")
def real_host(
    driver: Driver,
    driver_kernel: Kernel,
    nvidia_key: SigningKey,
    tmp_path_factory: pytest.TempPathFactory,
) -> Layout:
    """A host root whose target is the driver's Debian kernel, whole (vmlinuz, in-tree
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
    return Layout(install_real_target(layout.root, release, driver_kernel.root))

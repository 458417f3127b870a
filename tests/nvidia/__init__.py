"""The real NVIDIA driver as test fixtures: Debian's packages, built and signed here.

Used by the tests in this directory and by ``bench/verify --nvidia`` and
``bench/daemon --nvidia``::

    from tests.nvidia import build_driver, sign_driver

    driver = build_driver()                       # nvidia-kernel-source 535.261.03-1, cached
    key = make_key(tmp_path, "rsa4096")           # tests.kmod
    signed = sign_driver(driver, key, tmp_path)   # every .ko through scripts/sign-file
    firmware = driver.firmware                    # nvidia/535.261.03/gsp_*.bin below it

The packages come from Debian's archive through an apt configuration of the test cache's
own (:mod:`tests.nvidia.archive`); the build runs kbuild as DKMS does
(:mod:`tests.nvidia.build`) and is cached per package version and kernel release, so a
machine pays for it once. An unreachable archive fails the test that needs the driver.
"""

from __future__ import annotations

from pathlib import Path

from tests.kmod.keys import SigningKey, sign
from tests.nvidia.archive import ArchiveError
from tests.nvidia.build import (
    DEFAULT_VERSION,
    MODULE_NAMES,
    Driver,
    build_driver,
    gsp_firmware,
)
from tests.nvidia.target import install_real_target


def sign_driver(driver: Driver, key: SigningKey, into: Path) -> dict[str, Path]:
    """Every module of ``driver`` signed with ``key`` by the kernel's ``sign-file`` (sha256,
    issuer and serial), copied to ``into/<name>.ko``; name -> path, in load order."""
    into.mkdir(parents=True, exist_ok=True)
    return {name: sign(ko, key, into / f"{name}.ko") for name, ko in driver.modules.items()}


__all__ = [
    "DEFAULT_VERSION",
    "MODULE_NAMES",
    "ArchiveError",
    "Driver",
    "build_driver",
    "gsp_firmware",
    "install_real_target",
    "sign_driver",
]

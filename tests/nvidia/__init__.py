"""The real NVIDIA driver as test fixtures: Debian's packages, built and signed here.

Used by the tests in this directory and by ``bench/verify --nvidia`` and
``bench/daemon --nvidia``::

    from tests.nvidia import build_driver, sign_driver

    driver = build_driver()                       # nvidia-kernel-source 535.261.03-1, cached
    key = make_key(tmp_path, "rsa4096")           # tests.kmod
    signed = sign_driver(driver, key, tmp_path)   # every .ko through scripts/sign-file
    firmware = driver.firmware                    # nvidia/535.261.03/gsp_*.bin below it

The packages, the build and the signing are the driver image builder's (``build-image``,
:mod:`buildimage` in deploy/driver-container): Debian's archive through an apt
configuration of the test cache's own, kbuild as DKMS runs it, cached per package version
and kernel release (:mod:`tests.nvidia.build`), each kernel's own ``sign-file``. A machine
pays for a build once. An unreachable archive fails the test that needs the driver.
"""

from __future__ import annotations

import shutil
from pathlib import Path

from buildimage.archive import ArchiveError
from buildimage.kernel import KernelFiles
from buildimage.sign import Signer, sign

from tests.kmod.keys import SigningKey
from tests.nvidia.build import (
    DEFAULT_VERSION,
    MODULE_NAMES,
    Driver,
    build_driver,
    gsp_firmware,
)
from tests.nvidia.target import install_real_target
from tests.vm.harness.kernel import Kernel

#: What an operator's kernelModuleConfig would carry (one file per module, several
#: parameters a line, the last newline missing). Each name is checked against the
#: module's own parm list (tests/nvidia/test_pipeline.py), so a parameter the driver does not
#: have fails the test.
PARAMS = {
    "nvidia": "NVreg_EnableGpuFirmware=1 NVreg_PreserveVideoMemoryAllocations=1\n"
    "NVreg_DeviceFileMode=0660",
    "nvidia-drm": "modeset=1",
    "nvidia-uvm": "uvm_perf_prefetch_enable=1",
}

#: The driver each Debian release's archive carries, by the series of its kernel: bookworm's
#: 535 for Debian 12's 6.1, trixie's 550 for Debian 13's 6.12, sid's 550 for 7.2.
RELEASE_DRIVER = {"6.1": DEFAULT_VERSION, "6.12": "550.163.01-2", "7.2": "550.163.01-5.1"}


def driver_for(kernel: Kernel) -> Driver:
    """The driver of ``kernel``'s own Debian release built against its headers (for 6.12 in
    its Debian 13 root, with its gcc-14), cached like :func:`build_driver`."""
    root = kernel.root if kernel.own_root else None
    return build_driver(RELEASE_DRIVER[kernel.series], release=kernel.release, root=root)


def sign_driver(
    driver: Driver, key: SigningKey, into: Path, kernel: Kernel | None = None
) -> dict[str, Path]:
    """Every module of ``driver`` signed with ``key`` by ``sign-file`` (sha256, issuer and
    serial) as ``build-image`` signs them: ``kernel``'s own (default: this machine's
    kernel's), copied to ``into/<name>.ko``; name -> path, in load order."""
    into.mkdir(parents=True, exist_ok=True)
    kernel = kernel or Kernel.find(driver.kernel)
    signed = {name: into / f"{name}.ko" for name in driver.modules}
    for name, ko in driver.modules.items():
        shutil.copyfile(ko, signed[name])
    files = KernelFiles(kernel.release, kernel.root)
    sign(files, list(signed.values()), Signer(str(key.key), key.cert_pem), into)
    return signed


__all__ = [
    "DEFAULT_VERSION",
    "MODULE_NAMES",
    "PARAMS",
    "RELEASE_DRIVER",
    "ArchiveError",
    "Driver",
    "build_driver",
    "driver_for",
    "gsp_firmware",
    "install_real_target",
    "sign_driver",
]

"""The real NVIDIA driver built by the driver image's builder, in the test cache.

The build itself is ``build-image``'s (:mod:`buildimage.nvidia`, deploy/driver-container):
Debian's ``nvidia-kernel-source`` fetched with an apt configuration of the cache's own, kbuild
run as DKMS runs it (in the kernel's own Debian root for 6.12 and 7.2), ``strip -g``, and
the unsigned modules cached per package version and kernel release. Here it is only pointed
at the test cache (``$MODSTAGE_TEST_CACHE``) and this machine's kernel by default, and the
driver gains its firmware directory as a property.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from pathlib import Path

from buildimage import nvidia
from buildimage.kernel import KernelFiles
from buildimage.nvidia import MODULE_NAMES

from tests.kmod.build import cache_root, kernel_release

DEFAULT_VERSION = "535.261.03-1"  # Debian 12's (bookworm) driver


@dataclass(frozen=True)
class Driver(nvidia.Driver):
    """One built, unsigned NVIDIA driver (:class:`buildimage.nvidia.Driver`) and its firmware."""

    @property
    def firmware(self) -> Path:
        """The GSP firmware directory of the same version (``nvidia/<version>/gsp_*.bin``
        below it), fetched on first use."""
        return gsp_firmware(self.package_version)


def build_driver(
    package_version: str = DEFAULT_VERSION,
    flavor: str = "proprietary",
    release: str | None = None,
    root: Path | None = None,
) -> Driver:
    """The NVIDIA modules of ``flavor`` at Debian version ``package_version`` built against
    ``release`` (default :func:`tests.kmod.kernel_release`), unsigned, built once per machine.
    ``root``: the Debian root holding that release's headers and compiler (default: this
    machine's own)."""
    kernel = KernelFiles(release or kernel_release(), root or Path("/"))
    built = nvidia.build_driver(cache_root(), package_version, kernel, flavor)
    return Driver(**{f.name: getattr(built, f.name) for f in fields(built)})


def gsp_firmware(package_version: str = DEFAULT_VERSION) -> Path:
    """A directory holding ``nvidia/<version>/gsp_*.bin`` from ``firmware-nvidia-gsp``."""
    return nvidia.gsp_firmware(cache_root(), package_version)


__all__ = ["DEFAULT_VERSION", "MODULE_NAMES", "Driver", "build_driver", "gsp_firmware"]

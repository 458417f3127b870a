"""The signed shim and grub a Secure Boot node boots each kernel with: its own release's.

Debian 12's 6.1 boots through the host's `shim-signed` and `grub-efi-amd64-signed` (Debian 12's,
tests/vm/host-setup.sh). Debian 13's 6.12 boots through Debian 13's, sid's 7.2 through sid's:
the two packages are resolved and `apt-get download`ed with the suite's private apt
configuration of debian.py (`apt-<suite>/` in the cache, never the host's apt), unpacked with
`dpkg-deb -x` into `secureboot-<suite>-<key>/` (keyed by their versions, so they stay pinned as
the suite's kernel does until `apt-<suite>/` is removed) and used from there. Nothing is
installed on the host.
"""

from __future__ import annotations

import functools
import hashlib
from dataclasses import dataclass
from pathlib import Path

from . import debian
from .errors import VmSetupError
from .kernel import Kernel, cache_dir

PACKAGES = ("shim-signed", "grub-efi-amd64-signed")
SHIM = Path("usr/lib/shim/shimx64.efi.signed")  # inside a root: the host's or the unpacked one
GRUB = Path("usr/lib/grub/x86_64-efi-signed/grubx64.efi.signed")


@dataclass(frozen=True)
class Loaders:
    """The Microsoft-signed shim and the Debian-signed grub of one Debian release."""

    suite: str
    shim: Path
    grub: Path
    versions: str  # "shim-signed <ver>, grub-efi-amd64-signed <ver>", for messages

    def require(self) -> None:
        """Raise VmSetupError naming a missing binary and where it comes from."""
        for path in (self.shim, self.grub):
            if not path.exists():
                raise VmSetupError(f"{path} is missing ({self.suite}: {self.versions})")


def host() -> Loaders:
    """Debian 12's shim and grub, installed on the host (tests/vm/host-setup.sh)."""
    return Loaders(
        "bookworm (host)",
        Path("/") / SHIM,
        Path("/") / GRUB,
        "install shim-signed and grub-efi-amd64-signed (tests/vm/host-setup.sh)",
    )


def _candidates(suite: debian.Suite) -> dict[str, str]:
    """Package -> version of PACKAGES in the suite's private lists."""
    debian._lists_ready(suite)  # the lists are fetched once, as for the kernel
    shown = debian._run(["apt-cache", *debian._apt_options(suite), "show", *PACKAGES])
    versions: dict[str, str] = {}
    for stanza in shown.split("\n\n"):
        fields = dict(line.split(": ", 1) for line in stanza.splitlines() if ": " in line)
        if fields.get("Package") in PACKAGES:
            versions.setdefault(fields["Package"], fields["Version"])
    missing = [name for name in PACKAGES if name not in versions]
    if missing:
        raise VmSetupError(
            f"{suite.name}'s lists in {debian._apt_dir(suite)} lack {', '.join(missing)}"
        )
    return versions


@functools.cache
def of_suite(suite: debian.Suite) -> Loaders:
    """The suite's shim and grub, downloaded and unpacked into the cache on first use."""
    versions = _candidates(suite)
    listed = ", ".join(f"{name} {version}" for name, version in versions.items())
    key = hashlib.sha256(listed.encode()).hexdigest()[:16]
    final = cache_dir() / f"secureboot-{suite.name}-{key}"
    loaders = Loaders(suite.name, final / SHIM, final / GRUB, listed)

    def make(tree: Path) -> str:
        downloads = tree.with_name("debs")
        downloads.mkdir()
        pinned = [f"{name}={version}" for name, version in versions.items()]
        debian._run(
            ["apt-get", *debian._apt_options(suite), "-qq", "download", *pinned], cwd=downloads
        )
        for deb in sorted(downloads.glob("*.deb")):
            debian._run(["dpkg-deb", "-x", str(deb), str(tree)])
        return listed

    debian.built_once(final, f"secureboot-{suite.name}", make)
    loaders.require()
    return loaders


def for_kernel(kernel: Kernel) -> Loaders:
    """The shim and grub of `kernel`'s own Debian release: 12's for 6.1, 13's for 6.12, sid's
    for 7.2."""
    if kernel.series == "6.1":
        return host()
    if kernel.series in debian.SUITES:
        return of_suite(debian.SUITES[kernel.series])
    raise VmSetupError(f"no Secure Boot chain known for {kernel.release}")

"""The signed shim and grub a Secure Boot node boots each kernel with: its own release's.

Debian 12's 6.1 boots through the host's `shim-signed` and `grub-efi-amd64-signed` (Debian 12's,
tests/vm/host-setup.sh). Debian 13's 6.12 boots through Debian 13's: the two packages are
resolved and `apt-get download`ed with the private trixie apt configuration of debian13.py
(`apt-trixie/` in the cache, never the host's apt), unpacked with `dpkg-deb -x` into
`secureboot-trixie-<key>/` (keyed by their versions, so they stay pinned as the 6.12 kernel
does until `apt-trixie/` is removed) and used from there. Nothing is installed on the host.
"""

from __future__ import annotations

import fcntl
import functools
import hashlib
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path

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


def _candidates() -> dict[str, str]:
    """Package -> version of PACKAGES in the private trixie lists."""
    from . import debian13

    if not any((debian13._apt_dir() / "var/lib/apt/lists").glob("*_Packages*")):
        debian13._apt_update()  # the lists are fetched once, as for the kernel
    shown = debian13._run(["apt-cache", *debian13._apt_options(), "show", *PACKAGES])
    versions: dict[str, str] = {}
    for stanza in shown.split("\n\n"):
        fields = dict(line.split(": ", 1) for line in stanza.splitlines() if ": " in line)
        if fields.get("Package") in PACKAGES:
            versions.setdefault(fields["Package"], fields["Version"])
    missing = [name for name in PACKAGES if name not in versions]
    if missing:
        raise VmSetupError(f"trixie's lists in {debian13._apt_dir()} lack {', '.join(missing)}")
    return versions


@functools.cache
def trixie() -> Loaders:
    """Debian 13's shim and grub, downloaded and unpacked into the cache on first use."""
    from . import debian13

    versions = _candidates()
    listed = ", ".join(f"{name} {version}" for name, version in versions.items())
    key = hashlib.sha256(listed.encode()).hexdigest()[:16]
    final = cache_dir() / f"secureboot-{debian13.SUITE}-{key}"
    loaders = Loaders(debian13.SUITE, final / SHIM, final / GRUB, listed)
    if (final / ".complete").exists():
        return loaders
    with open(cache_dir() / f"secureboot-{debian13.SUITE}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if (final / ".complete").exists():
            return loaders
        work = Path(tempfile.mkdtemp(prefix=f"secureboot-{debian13.SUITE}-", dir=cache_dir()))
        try:
            pinned = [f"{name}={version}" for name, version in versions.items()]
            debian13._run(
                ["apt-get", *debian13._apt_options(), "-qq", "download", *pinned], cwd=work
            )
            tree = work / "tree"
            for deb in sorted(work.glob("*.deb")):
                debian13._run(["dpkg-deb", "-x", str(deb), str(tree)])
            shutil.rmtree(final, ignore_errors=True)
            tree.rename(final)
            (final / ".complete").write_text(listed + "\n")
        finally:
            shutil.rmtree(work, ignore_errors=True)
    loaders.require()
    return loaders


def for_kernel(kernel: Kernel) -> Loaders:
    """The shim and grub of `kernel`'s own Debian release: 12's for 6.1, 13's for 6.12."""
    if kernel.series == "6.1":
        return host()
    if kernel.series == "6.12":
        return trixie()
    raise VmSetupError(f"no Secure Boot chain known for {kernel.release}")

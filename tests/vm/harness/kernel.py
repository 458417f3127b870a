"""The guest kernel: Debian's signed kernel from the host's linux-image package, and the cache.

Booting the uncompressed ELF kernel instead of the bzImage saves about 5 s per boot under TCG,
because the guest does not have to run the xz decompressor emulated. It is extracted once per
kernel image (keyed by the image's digest) into the harness cache directory.
"""

from __future__ import annotations

import hashlib
import lzma
import os
import platform
from dataclasses import dataclass
from pathlib import Path

from .errors import VmSetupError

XZ_MAGIC = b"\xfd7zXZ\x00"
ELF_MAGIC = b"\x7fELF"


def cache_dir() -> Path:
    """Where built images live: `$MODSTAGE_VM_CACHE`, else `~/.cache/modstage-vm`."""
    root = os.environ.get("MODSTAGE_VM_CACHE") or Path.home() / ".cache" / "modstage-vm"
    path = Path(root)
    path.mkdir(parents=True, exist_ok=True)
    return path


def write_atomically(path: Path, data: bytes) -> None:
    """Publish a cache entry by rename, so concurrent runs never see half a file."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_bytes(data)
    os.replace(tmp, path)


def default_release() -> str:
    """The kernel release to boot: `$MODSTAGE_VM_KERNEL`, else the only one in /lib/modules."""
    if env := os.environ.get("MODSTAGE_VM_KERNEL"):
        return env
    releases = sorted(
        p.name for p in Path("/lib/modules").glob("*") if Path(f"/boot/vmlinuz-{p.name}").exists()
    )
    if not releases:
        raise VmSetupError(
            "no kernel with both /boot/vmlinuz-<ver> and /lib/modules/<ver>; "
            "run tests/vm/host-setup.sh (installs linux-image-amd64)"
        )
    return releases[-1]


def extract_vmlinux(bzimage: bytes) -> bytes:
    """Return the ELF kernel inside an xz-compressed bzImage."""
    start = bzimage.find(XZ_MAGIC)
    while start != -1:
        try:
            elf = lzma.LZMADecompressor().decompress(bzimage[start:])
        except lzma.LZMAError:
            elf = b""
        if elf.startswith(ELF_MAGIC):
            return elf
        start = bzimage.find(XZ_MAGIC, start + 1)
    raise VmSetupError("no xz-compressed ELF kernel found inside the bzImage")


@dataclass(frozen=True)
class Kernel:
    """A kernel release on the host: its bzImage and its module tree."""

    release: str
    image: Path
    modules: Path

    @classmethod
    def find(cls, release: str | None = None) -> Kernel:
        """The host's kernel package for `release` (default: see `default_release`)."""
        release = release or default_release()
        kernel = cls(release, Path(f"/boot/vmlinuz-{release}"), Path(f"/lib/modules/{release}"))
        for path in (kernel.image, kernel.modules / "modules.dep"):
            if not path.exists():
                raise VmSetupError(f"{path} is missing; run tests/vm/host-setup.sh")
        if platform.machine() != "x86_64":
            raise VmSetupError("the VM harness boots x86_64 guests only")
        return kernel

    def vmlinux(self) -> Path:
        """The uncompressed kernel, extracted on first use and cached by the image's digest."""
        data = self.image.read_bytes()
        digest = hashlib.sha256(data).hexdigest()[:16]
        path = cache_dir() / f"vmlinux-{self.release}-{digest}"
        if not path.exists():
            write_atomically(path, extract_vmlinux(data))
        return path

"""The guest's initramfs: static busybox, the harness's PID 1, and the modules it needs.

The modules are what it takes to mount the host's root over virtio-9p with an overlay on top,
plus virtio_console for the agent's channel; `modprobe --show-depends` lists them in load
order (in-tree modules are `.ko.xz` on Debian 13: they go in decompressed, for busybox's
insmod). The archive is written directly in the cpio "newc" format (no cpio tool needed) and cached
under a name derived from every input, so a changed init script or kernel rebuilds it.
"""

from __future__ import annotations

import hashlib
import lzma
import shutil
import stat
import subprocess
import time
from pathlib import Path

from .errors import VmSetupError
from .kernel import Kernel, cache_dir, write_atomically

GUEST_MODULES = ("virtio_pci", "virtio_console", "9pnet_virtio", "9p", "overlay")
INIT_SCRIPT = Path(__file__).with_name("init.sh")
STALE_AFTER = 86400.0  # seconds; older archives for other inputs are removed on a rebuild


class Cpio:
    """A minimal writer for the newc cpio format the kernel unpacks into its rootfs."""

    def __init__(self) -> None:
        self._parts: list[bytes] = []
        self._ino = 0

    def _entry(
        self, name: str, mode: int, data: bytes = b"", rdev: tuple[int, int] = (0, 0)
    ) -> None:
        self._ino += 1
        encoded = name.encode() + b"\0"
        fields = (self._ino, mode, 0, 0, 1, 0, len(data), 0, 0, *rdev, len(encoded), 0)
        header = b"070701" + b"".join(b"%08x" % field for field in fields)
        self._parts.append(_pad(header + encoded) + _pad(data))

    def directory(self, name: str) -> None:
        """Add a directory (0755)."""
        self._entry(name, stat.S_IFDIR | 0o755)

    def file(self, name: str, data: bytes, mode: int = 0o644) -> None:
        """Add a regular file."""
        self._entry(name, stat.S_IFREG | mode, data)

    def char_device(self, name: str, major: int, minor: int) -> None:
        """Add a character device node (the kernel needs /dev/console before devtmpfs)."""
        self._entry(name, stat.S_IFCHR | 0o600, rdev=(major, minor))

    def finish(self) -> bytes:
        """The archive, with its trailer."""
        self._entry("TRAILER!!!", 0)
        return b"".join(self._parts)


def _pad(data: bytes) -> bytes:
    return data + b"\0" * (-len(data) % 4)


def module_paths(kernel: Kernel, names: tuple[str, ...] = GUEST_MODULES) -> list[Path]:
    """The .ko files `names` need, dependencies first, each once (builtins are skipped)."""
    modprobe = shutil.which("modprobe") or "/usr/sbin/modprobe"
    out = subprocess.run(
        [modprobe, "-d", str(kernel.root), "-S", kernel.release, "-a", "--show-depends", *names],
        capture_output=True,
        text=True,
        check=False,
    )
    if out.returncode != 0:
        raise VmSetupError(f"modprobe --show-depends failed: {out.stderr.strip()}")
    paths: list[Path] = []
    for line in out.stdout.splitlines():
        words = line.split()
        if len(words) >= 2 and words[0] == "insmod" and Path(words[1]) not in paths:
            paths.append(Path(words[1]))
    return paths


def _module_file(path: Path) -> tuple[str, bytes]:
    """The name and ELF bytes of an in-tree module, decompressed if it is a `.ko.xz`."""
    if path.suffix == ".xz":
        return path.name.removesuffix(".xz"), lzma.decompress(path.read_bytes())
    return path.name, path.read_bytes()


def busybox() -> Path:
    """The static busybox binary (package busybox-static)."""
    for candidate in (Path("/bin/busybox"), Path("/usr/bin/busybox")):
        if candidate.exists():
            return candidate
    raise VmSetupError("busybox is missing; run tests/vm/host-setup.sh (busybox-static)")


def build(kernel: Kernel) -> Path:
    """Build (or reuse) the initramfs for `kernel`; returns the cached archive's path."""
    inputs = [busybox(), INIT_SCRIPT, *module_paths(kernel)]
    digest = hashlib.sha256()
    for path in inputs:
        digest.update(str(path).encode() + b"\0" + path.read_bytes())
    target = cache_dir() / f"initramfs-{kernel.release}-{digest.hexdigest()[:16]}.cpio"
    if target.exists():
        return target
    archive = Cpio()
    for directory in ("bin", "dev", "modules", "proc", "sys"):
        archive.directory(directory)
    archive.char_device("dev/console", 5, 1)
    archive.file("bin/busybox", busybox().read_bytes(), 0o755)
    archive.file("init", INIT_SCRIPT.read_bytes(), 0o755)
    names = []
    for module in inputs[2:]:
        name, data = _module_file(module)
        archive.file(f"modules/{name}", data)
        names.append(name)
    archive.file("modules.order", "".join(f"{name}\n" for name in names).encode())
    write_atomically(target, archive.finish())
    for stale in cache_dir().glob(f"initramfs-{kernel.release}-*.cpio"):
        if stale != target and time.time() - stale.stat().st_mtime > STALE_AFTER:
            stale.unlink(missing_ok=True)
    return target

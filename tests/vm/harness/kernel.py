"""The guest kernels: Debian 12's signed 6.1 from the host's linux-image package, Debian 13's
signed 6.12 and sid's signed 7.2 each in its suite's own root (debian.py), and the cache.

Booting the uncompressed ELF kernel instead of the bzImage saves about 5 s per boot under TCG,
because the guest does not have to run the xz (6.1) or zstd (6.12) decompressor emulated. It is
extracted once per kernel image (keyed by the image's digest) into the harness cache directory.

`MODSTAGE_KERNELS` (a comma-separated list from `6.1`, `6.12` and `7.2`; the default is all
three) names the kernels the VM tests run on; `Kernel.named(series)` gives each.
"""

from __future__ import annotations

import hashlib
import lzma
import os
import platform
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from .errors import VmSetupError

if TYPE_CHECKING:
    from . import debian

XZ_MAGIC = b"\xfd7zXZ\x00"
ZSTD_MAGIC = b"\x28\xb5\x2f\xfd"
SERIES = ("6.1", "6.12", "7.2")
# `auto_online_blocks` as each kernel boots: Debian 12's 6.1 leaves hot-added memory offline;
# Debian 13's 6.12 and sid's 7.2 (CONFIG_MHP_DEFAULT_ONLINE_TYPE_ONLINE_AUTO=y) online it
# themselves, into ZONE_NORMAL
AUTO_ONLINE_AT_BOOT = {"6.1": "offline", "6.12": "online", "7.2": "online"}
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


def kernel_series() -> tuple[str, ...]:
    """`MODSTAGE_KERNELS`: the kernel series the VM tests run on (default: all of SERIES)."""
    value = os.environ.get("MODSTAGE_KERNELS", ",".join(SERIES))
    chosen = tuple(word.strip() for word in value.split(",") if word.strip())
    unknown = [word for word in chosen if word not in SERIES]
    if unknown or not chosen:
        raise VmSetupError(f"MODSTAGE_KERNELS={value!r}: pick from {', '.join(SERIES)}")
    return chosen


def _unxz(data: bytes) -> bytes:
    return lzma.LZMADecompressor().decompress(data)


def _unzstd(data: bytes) -> bytes:
    import zstandard  # a host dependency of modstage (pyproject.toml)

    return zstandard.ZstdDecompressor().decompressobj().decompress(data)


def extract_vmlinux(bzimage: bytes) -> bytes:
    """Return the ELF kernel inside an xz- (Debian 12) or zstd-compressed (Debian 13) bzImage."""
    for magic, decompress in ((XZ_MAGIC, _unxz), (ZSTD_MAGIC, _unzstd)):
        start = bzimage.find(magic)
        while start != -1:
            try:
                elf = decompress(bzimage[start:])
            except Exception:  # lzma.LZMAError, zstandard.ZstdError: not this stream
                elf = b""
            if elf.startswith(ELF_MAGIC):
                return elf
            start = bzimage.find(magic, start + 1)
    raise VmSetupError("no xz- or zstd-compressed ELF kernel found inside the bzImage")


@dataclass(frozen=True)
class Kernel:
    """A kernel release: its bzImage and module tree, and the root the guest boots with it
    (`/`, the host's own, for Debian 12's 6.1; the suite's cached root for 6.12 and 7.2)."""

    release: str
    image: Path
    modules: Path
    root: Path = Path("/")

    @property
    def series(self) -> str:
        """ "6.1", "6.12" or "7.2": the upstream series of the release."""
        return ".".join(self.release.split(".")[:2]).split("-")[0]

    @property
    def own_root(self) -> bool:
        """Whether the guest boots a root of its own rather than the host's."""
        return self.root != Path("/")

    @classmethod
    def named(cls, series: str) -> Kernel:
        """Debian 12's kernel for "6.1", Debian 13's for "6.12", sid's for "7.2" (in their roots)."""
        if series == "6.1":
            return cls.find()
        from . import debian

        if series in debian.SUITES:
            return cls.of_suite(debian.SUITES[series])
        raise VmSetupError(f"no kernel series {series!r}; known: {', '.join(SERIES)}")

    @classmethod
    def of_suite(cls, suite: debian.Suite) -> Kernel:
        """The suite's signed kernel in its cached root (built on first use). Its image is
        `/boot/vmlinuz-<release>` (6.12) or, where nothing copied it to /boot,
        `/usr/lib/modules/<release>/vmlinuz` (7.2's packages)."""
        from . import debian

        root = debian.root(suite)
        _version, release = debian.kernel_version(suite)
        modules = root / f"usr/lib/modules/{release}"
        image = next(
            (p for p in (root / f"boot/vmlinuz-{release}", modules / "vmlinuz") if p.exists()),
            modules / "vmlinuz",
        )
        kernel = cls(release, image, modules, root)
        if not (kernel.modules / "modules.dep").exists():
            raise VmSetupError(f"{kernel.modules}/modules.dep is missing; remove {root}")
        return kernel

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

    @property
    def config(self) -> Path:
        """The kernel's build configuration: `/boot/config-<release>` where its packages put
        one there (6.1, 6.12), else `config` in its module tree (7.2)."""
        boot = self.root / f"boot/config-{self.release}"
        return boot if boot.exists() else self.modules / "config"

    @property
    def guest_image(self) -> str:
        """The kernel image's path as the guest sees it (its root is `self.root`)."""
        return "/" + str(self.image.relative_to(self.root))

    def in_tree(self, name: str) -> str:
        """The in-tree module `name`'s path under its module tree as modules.dep lists it
        (`kernel/lib/crc8.ko` on 6.1, `kernel/lib/crc/crc8.ko.xz` on 7.2)."""
        for line in (self.modules / "modules.dep").read_text().splitlines():
            path = line.split(":", 1)[0]
            if path.rsplit("/", 1)[-1].split(".ko")[0] == name:
                return path
        raise VmSetupError(f"{self.modules}/modules.dep lists no module {name}")

    def vmlinux(self) -> Path:
        """The uncompressed kernel, extracted on first use and cached by the image's digest."""
        data = self.image.read_bytes()
        digest = hashlib.sha256(data).hexdigest()[:16]
        path = cache_dir() / f"vmlinux-{self.release}-{digest}"
        if not path.exists():
            write_atomically(path, extract_vmlinux(data))
        return path

"""A Secure Boot node: OVMF with Secure Boot on, Debian's signed shim and grub, the signed kernel.

    store = enroll(tmp / "vars.fd", mok=[ca_pem])            # or db=[...], dbx=[...], dbx_hashes
    with SecureBootVm.boot(state_dir, vars_store=store, kernel=kernel) as vm:   # 6.1 or 6.12
        vm.read("/sys/kernel/security/lockdown")               # none [integrity] confidentiality

The chain is a real Debian host's (the keyrings it fills: docs/kernel.md, "Keyrings and
Secure Boot"): `OVMF_CODE_4M.secboot.fd` from `ovmf` on pflash unit 0 (read-only), a vars store made from `OVMF_VARS_4M.ms.fd` (Microsoft's keys, Secure
Boot on) on unit 1, and a FAT ESP built without loop mounts (`sfdisk`, then mtools' `mformat`,
`mmd`, `mcopy` at the partition's offset) holding `shimx64.efi.signed` as `EFI/BOOT/BOOTX64.EFI`,
`grubx64.efi.signed` beside it, `EFI/debian/grub.cfg` (which the signed grub reads), the signed
bzImage (shim's verifier checks it before grub starts it) and the test bed's own initramfs.
Certificates are enrolled the way hosts enroll them, into the firmware's variables, by
`virt-fw-vars` (PyPI's `virt-firmware`): `MokList` (shim copies it to `MokListRT`; the kernel
files it in `.machine`), `db` (`.platform`) and `dbx` (certificates and sha256 hashes: the
kernel's `.blacklist`). The kernel then runs locked down (`[integrity]`) with `sig_enforce` Y.

Each kernel boots through its own release's shim and grub (loaders.py): Debian 12's 6.1 through
the host's (Debian 12's) packages, Debian 13's 6.12 through Debian 13's, fetched with the
private trixie apt configuration and unpacked into the cache. OVMF is the host's for both.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

from . import loaders
from .errors import VmSetupError
from .kernel import Kernel
from .loaders import Loaders
from .qemu import Uefi
from .vm import Vm

OVMF_CODE = Path("/usr/share/OVMF/OVMF_CODE_4M.secboot.fd")
OVMF_VARS = Path("/usr/share/OVMF/OVMF_VARS_4M.ms.fd")
OWNER = "6d6f6473-7461-6765-2074-657374206264"  # the signature owner GUID of what the tests add
SECTOR = 512
ESP_START = 2048  # sectors: the partition starts at 1 MiB
SECURITYFS = (
    "grep -q ' /sys/kernel/security ' /proc/mounts || mount -t securityfs none /sys/kernel/security"
)
BOOT_TIMEOUT = 300.0  # ~15 s under TCG on an idle machine, minutes on a busy one; a chain
# refused at grub hangs there


def _tool(name: str, package: str) -> str:
    found = shutil.which(name) or shutil.which(name, path="/usr/sbin:/sbin")
    if found is None:
        raise VmSetupError(f"{name} is missing; install {package} (tests/vm/host-setup.sh)")
    return found


def _run(argv: Sequence[str], **options: Any) -> None:
    proc = subprocess.run(list(argv), capture_output=True, text=True, check=False, **options)
    if proc.returncode != 0:
        raise VmSetupError(f"{' '.join(argv)} exited {proc.returncode}: {proc.stderr.strip()}")


def require() -> None:
    """Raise VmSetupError naming what is missing on the host for a Secure Boot node (the
    shim and grub are the kernel's: loaders.py)."""
    for path, package in ((OVMF_CODE, "ovmf"), (OVMF_VARS, "ovmf")):
        if not path.exists():
            raise VmSetupError(f"{path} is missing; install {package} (tests/vm/host-setup.sh)")
    _tool("mformat", "mtools")
    _tool("sfdisk", "fdisk")
    _tool("virt-fw-vars", "virt-firmware (pip; the test extra)")


def enroll(
    out: Path,
    *,
    mok: Sequence[Path] = (),
    db: Sequence[Path] = (),
    dbx: Sequence[Path] = (),
    dbx_hashes: Sequence[str] = (),
) -> Path:
    """A vars store at `out`: Microsoft's keys with Secure Boot on (OVMF_VARS_4M.ms.fd) plus
    the given certificates (PEM or DER) in MokList, db and dbx, and sha256 hashes (hex) in
    dbx, each with the OWNER GUID."""
    require()
    argv = [_tool("virt-fw-vars", "virt-firmware"), "-i", str(OVMF_VARS), "-o", str(out)]
    for option, certs in (("--add-mok", mok), ("--add-db", db), ("--add-dbx-cert", dbx)):
        for cert in certs:
            argv += [option, OWNER, str(cert)]
    for digest in dbx_hashes:
        argv += ["--add-dbx-hash", OWNER, digest]
    _run(argv)
    return out


def build_esp(
    out: Path, *, image: Path, initrd: Path, cmdline: str, chain: Loaders | None = None
) -> Path:
    """A GPT disk image at `out` with one EFI system partition: `chain`'s shim and grub (the
    host's by default), grub.cfg booting `image` (the signed bzImage) with `initrd` and
    `cmdline`."""
    require()
    chain = chain or loaders.host()
    chain.require()
    payload = sum(p.stat().st_size for p in (image, initrd, chain.shim, chain.grub))
    sectors = max(64 << 20, payload * 2) // SECTOR  # FAT32 wants >= 32 MiB
    out.unlink(missing_ok=True)
    with open(out, "wb") as f:
        f.truncate((ESP_START + sectors + 64) * SECTOR)  # room for the backup GPT
    layout = f"label: gpt\nstart={ESP_START}, size={sectors}, type=uefi\n"
    _run([_tool("sfdisk", "fdisk"), "--quiet", str(out)], input=layout)
    env = {**os.environ, "MTOOLS_SKIP_CHECK": "1"}
    part = f"{out}@@{ESP_START * SECTOR}"
    _run(
        [_tool("mformat", "mtools"), "-i", part, "-F", "-T", str(sectors), "-v", "ESP", "::"],
        env=env,
    )
    _run([_tool("mmd", "mtools"), "-i", part, "::/EFI", "::/EFI/BOOT", "::/EFI/debian"], env=env)
    config = out.with_name(out.name + ".grub.cfg")
    config.write_text(
        "set timeout=0\nset default=0\n"
        f"menuentry modstage {{\n  linux /vmlinuz {cmdline}\n  initrd /initrd.img\n}}\n"
    )
    for source, target in (
        (chain.shim, "::/EFI/BOOT/BOOTX64.EFI"),
        (chain.grub, "::/EFI/BOOT/grubx64.efi"),
        (config, "::/EFI/debian/grub.cfg"),
        (image, "::/vmlinuz"),
        (initrd, "::/initrd.img"),
    ):
        _run([_tool("mcopy", "mtools"), "-i", part, str(source), target], env=env)
    config.unlink()
    return out


class SecureBootVm(Vm):
    """A `Vm` booted through OVMF, shim and grub with Secure Boot on (see the module docstring).

    `vars_store` (from `enroll`) is this node's firmware variables: the Vm writes to its own
    copy, so it persists across the node's reboots as a host's NVRAM does. The ESP is rebuilt
    when a reboot changes the kernel arguments.
    """

    def __init__(self, state_dir: Path, *, vars_store: Path, **options: Any) -> None:
        options.setdefault("boot_timeout", BOOT_TIMEOUT)
        kernel: Kernel = options.get("kernel") or Kernel.find()
        self.chain = loaders.for_kernel(kernel)  # its own release's shim and grub
        options["kernel"] = kernel
        super().__init__(state_dir, **options)
        own_vars = self._runtime / "vars.fd"
        shutil.copyfile(vars_store, own_vars)
        uefi = Uefi(OVMF_CODE, own_vars, self._runtime / "esp.img")
        self.machine = replace(self.machine, uefi=uefi)
        self._esp_cmdline: str | None = None

    def start(
        self, kernel_args: Sequence[str] | None = None, devices: Sequence[str] | None = None
    ) -> None:
        """(Re)build the ESP for the boot's command line, then boot through the firmware."""
        if kernel_args is not None:
            self.machine = replace(self.machine, kernel_args=tuple(kernel_args))
        if devices is not None:
            self.machine = replace(self.machine, devices=tuple(devices))
        cmdline = self.machine.cmdline()
        uefi = self.machine.uefi
        assert uefi is not None
        if cmdline != self._esp_cmdline:
            build_esp(
                uefi.esp,
                image=self.kernel.image,
                initrd=self.machine.initramfs,
                cmdline=cmdline,
                chain=self.chain,
            )
            self._esp_cmdline = cmdline
        super().start()
        # what systemd mounts on a host: lockdown's state is read from securityfs
        self.run(SECURITYFS).check()

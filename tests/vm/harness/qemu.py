"""The qemu command line for a test VM, and the choice between TCG and KVM.

`/dev/kvm` on these build machines is a nested flavour that cannot boot a stock kernel (qemu
aborts setting an MSR with `-cpu host`, or the guest hangs), so KVM is used only where a probe
boot proved it works (`MODSTAGE_VM_ACCEL=auto`, the default) or `MODSTAGE_VM_ACCEL=kvm` says so;
everywhere else the guest runs under multi-threaded TCG.
"""

from __future__ import annotations

import os
import re
import sys
from dataclasses import dataclass
from pathlib import Path

from .disk import STATE_DISK_MOUNT, cache_mode
from .errors import VmSetupError

REPO = Path(__file__).resolve().parents[3]
AGENT = Path(__file__).with_name("agent.py")
GUEST_STATE_DIR = "/var/lib/modstage"
GUEST_SHARE_DIR = "/mnt/modstage-share"  # where the state share goes when a disk holds the state
BASE_KERNEL_ARGS = ("console=ttyS0", "panic=-1", "quiet")


@dataclass(frozen=True)
class Uefi:
    """Boot through UEFI firmware with Secure Boot (secureboot.py builds these): the code image
    (read-only pflash unit 0), this node's vars store (pflash unit 1, written by the firmware and
    shim) and the ESP disk whose shim, grub and grub.cfg boot the signed kernel."""

    code: Path
    vars: Path
    esp: Path


@dataclass(frozen=True)
class Machine:
    """Everything that decides how one boot is started (the same for every reboot of a Vm).

    With `state_disk` (an ext4 image, see disk.py) the guest mounts that disk at
    GUEST_STATE_DIR and the state share at GUEST_SHARE_DIR instead. With `root_disk` (another
    ext4 image) the root's overlay keeps its changes there instead of on a tmpfs, so what the
    guest writes to its root (a package it installs) is still there after a reboot.
    """

    vmlinux: Path
    initramfs: Path
    state_dir: Path
    kernel_args: tuple[str, ...] = ()
    memory: str = "1G,slots=4,maxmem=4G"
    cpus: int = 1
    accel: str = "tcg"
    shell: bool = False
    state_disk: Path | None = None
    root: Path = Path("/")  # the guest's root file system: the host's, or a Debian 13 root
    devices: tuple[str, ...] = ()  # extra `-device` values (e.g. "edu", "pci-testdev")
    uefi: Uefi | None = None  # Secure Boot through firmware, shim and grub instead of -kernel
    root_disk: Path | None = None  # the overlay's upper layer, kept across reboots

    def _disks(self) -> list[Path]:
        """The virtio disks in their order (/dev/vda, /dev/vdb)."""
        return [d for d in (self.state_disk, self.root_disk) if d is not None]

    @property
    def own_root(self) -> bool:
        """Whether the guest's root is not the host's: the repository then comes on a share
        of its own (at the same path), and the agent runs on the root's own Python."""
        return self.root != Path("/")

    def cmdline(self) -> str:
        """The kernel command line: console, panic policy, the agent's location, then extras."""
        mode = ("modstage.mode=shell",) if self.shell else ()
        python = "/usr/bin/python3" if self.own_root else guest_python()
        repo = ("modstage.reposhare=1",) if self.own_root else ()
        agent = (
            f"modstage.python={python}",
            f"modstage.agent={AGENT}",
            f"modstage.repo={REPO}",
        )
        disk: tuple[str, ...] = ()
        if self.state_disk is not None:
            disk = ("modstage.statedisk=/dev/vda", f"modstage.statemount={STATE_DISK_MOUNT}")
        if self.root_disk is not None:
            disk += (f"modstage.rootdisk=/dev/vd{'b' if self.state_disk else 'a'}",)
        extra = (*agent, *repo, *mode, *disk, *self.kernel_args)
        return " ".join((*BASE_KERNEL_ARGS, *extra))

    def argv(self, sockets: Path) -> list[str]:
        """The qemu command; the agent and QMP sockets are created under `sockets`."""
        if self.accel == "kvm":
            accel = ["-accel", "kvm", "-cpu", "host"]
        else:
            accel = ["-accel", "tcg,thread=multi", "-cpu", "max"]
        nine_p = "security_model=none,multidevs=remap"
        serial = "mon:stdio" if self.shell else "stdio"
        disk: list[str] = []
        for image in self._disks():
            disk += ["-drive", f"file={image},if=virtio,format=raw,cache={cache_mode(image)}"]
        if self.own_root:
            disk += ["-virtfs", f"local,path={REPO},mount_tag=repo,readonly=on,{nine_p}"]
        machine = ["-machine", "pc"]
        boot = ["-kernel", str(self.vmlinux), "-initrd", str(self.initramfs)]
        boot += ["-append", self.cmdline()]
        if self.uefi is not None:  # the ESP on AHCI keeps the virtio disk /dev/vda
            machine = ["-machine", "q35,smm=on"]
            machine += ["-global", "driver=cfi.pflash01,property=secure,value=on"]
            boot = [
                *("-drive", f"if=pflash,format=raw,unit=0,readonly=on,file={self.uefi.code}"),
                *("-drive", f"if=pflash,format=raw,unit=1,file={self.uefi.vars}"),
                *("-drive", f"if=ide,format=raw,file={self.uefi.esp}"),
            ]
        return [
            qemu_binary(),
            *accel,
            *machine,
            *("-m", self.memory, "-smp", str(self.cpus)),
            *("-nographic", "-nodefaults", "-no-reboot", "-nic", "none", "-serial", serial),
            *boot,
            *("-virtfs", f"local,path={self.root},mount_tag=hostroot,readonly=on,{nine_p}"),
            *("-virtfs", f"local,path={self.state_dir},mount_tag=state,{nine_p}"),
            *("-device", "virtio-serial-pci"),
            *("-chardev", f"socket,id=agent,path={sockets / 'agent.sock'},server=on,wait=off"),
            *("-device", "virtserialport,chardev=agent,name=modstage.agent"),
            *("-qmp", f"unix:{sockets / 'qmp.sock'},server=on,wait=off"),
            *disk,
            *(arg for device in self.devices for arg in ("-device", device)),
        ]


def qemu_binary() -> str:
    """qemu-system-x86_64 (package qemu-system-x86)."""
    for directory in [*os.environ.get("PATH", "").split(os.pathsep), "/usr/bin"]:
        candidate = Path(directory) / "qemu-system-x86_64"
        if candidate.exists():
            return str(candidate)
    raise VmSetupError("qemu-system-x86_64 is missing; run tests/vm/host-setup.sh")


def guest_python() -> Path:
    """The host's Python for the guest: a real binary, never a pyenv shim (a shell script)."""
    if env := os.environ.get("MODSTAGE_VM_PYTHON"):
        return Path(env)
    executable = Path(sys.executable)
    with open(executable, "rb") as f:
        is_elf = f.read(4) == b"\x7fELF"
    return executable if is_elf else executable.resolve()


def accel_setting() -> str:
    """`MODSTAGE_VM_ACCEL`: `auto` (default: probe KVM once, cache the verdict), `tcg` or `kvm`."""
    value = os.environ.get("MODSTAGE_VM_ACCEL", "auto")
    if value not in ("tcg", "kvm", "auto"):
        raise VmSetupError(f"MODSTAGE_VM_ACCEL must be tcg, kvm or auto, not {value!r}")
    return value


def cpus_setting() -> int:
    """`MODSTAGE_VM_CPUS`: the guest's vCPUs (default 1). Under multi-threaded TCG on a loaded
    host a second vCPU makes a guest slower, not faster (measured on the 2-core CI machine with
    the other stream running: 200 forks 6.4-7.5 s with one vCPU, 20-23 s with two; `import
    service.cli` 0.44-0.54 s against 0.70-1.27 s). The likely cause, not measured: each vCPU is
    a host thread, and one descheduled while holding a guest lock or owing an IPI stalls the
    other."""
    value = os.environ.get("MODSTAGE_VM_CPUS", "1")
    if not value.isdigit() or not 1 <= int(value) <= 64:
        raise VmSetupError(
            f"MODSTAGE_VM_CPUS must be a number of vCPUs from 1 to 64, not {value!r}"
        )
    return int(value)


def parse_size(size: str | int) -> int:
    """Bytes in "512M", "1G", "4096" or an int."""
    if isinstance(size, int):
        return size
    match = re.fullmatch(r"(\d+)([KMGT]?)", size.strip().upper())
    if not match:
        raise ValueError(f"not a size: {size!r}")
    return int(match[1]) << {"": 0, "K": 10, "M": 20, "G": 30, "T": 40}[match[2]]

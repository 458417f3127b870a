"""Choosing the accelerator: TCG unless KVM is asked for, or a probe boot proved it works.

The probe (for `MODSTAGE_VM_ACCEL=auto`) boots the real guest once under KVM with a short
deadline; its verdict is cached per CPU model, qemu binary and kernel, so a machine pays for it
once. A KVM that cannot boot a stock kernel either makes qemu abort at once or hangs the guest.
"""

from __future__ import annotations

import hashlib
import os
import tempfile
from pathlib import Path

from .errors import VmError
from .kernel import cache_dir, write_atomically
from .qemu import accel_setting, qemu_binary

PROBE_TIMEOUT = 25.0


def _probe_key() -> str:
    cpu = next(
        (line for line in Path("/proc/cpuinfo").read_text().splitlines() if "model name" in line),
        "",
    )
    qemu = Path(qemu_binary()).stat()
    text = f"{cpu}|{qemu.st_size}|{qemu.st_mtime_ns}|{os.uname().release}"
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def kvm_works() -> bool:
    """Whether a KVM guest boots to its agent here (probed once, then cached)."""
    if not os.access("/dev/kvm", os.R_OK | os.W_OK):
        return False
    verdict = cache_dir() / f"kvm-probe-{_probe_key()}"
    if not verdict.exists():
        from .vm import Vm  # late: Vm itself calls choose_accel()

        with tempfile.TemporaryDirectory() as state:
            vm = Vm(Path(state), name="kvm-probe", accel="kvm", boot_timeout=PROBE_TIMEOUT)
            try:
                vm.start()
                works = vm.eval("1 + 1") == 2
            except VmError:
                works = False
            finally:
                vm.close()
        write_atomically(verdict, b"kvm\n" if works else b"tcg\n")
    return verdict.read_text().strip() == "kvm"


def choose_accel() -> str:
    """`tcg` or `kvm`, following `MODSTAGE_VM_ACCEL` (see qemu.accel_setting)."""
    setting = accel_setting()
    if setting == "auto":
        return "kvm" if kvm_works() else "tcg"
    return setting

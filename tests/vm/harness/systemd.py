"""systemd as PID 1 in the test VM, and what a test asks it.

    vm = Vm.boot(state_dir, kernel_args=systemd_args(tree))   # tree: an install's --root
    require_systemd(vm)
    show(vm, "modstage.service", "ActiveState", "NRestarts")   # {"ActiveState": "active", ...}
    journal(vm, "modstage.service", priority="err")            # journald's records, as dicts

`systemd-init.sh` does the guest side: it lays the tree over the root, adds the test bed's
units (modstage-vm.target, stand-ins for containerd and kubelet that record the modules
loaded when they start, the agent) and executes systemd. The agent starts after everything
else, so a booted Vm has finished starting its units; it powers off or reboots through
systemd when the host asks (`Vm.poweroff`, `Vm.reboot`).
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from .errors import VmBootError
from .vm import Vm

SAW = "/run/modstage-vm-saw"  # where the stand-ins record /proc/modules as they start


def systemd_args(tree: Path | None = None) -> list[str]:
    """Kernel arguments for a systemd boot, laying the install tree `tree` over the root."""
    # no_timer_check: under TCG on a loaded host the kernel's IO-APIC timer check can time
    # out and panic ("IO-APIC + timer doesn't work!"); a systemd boot is long enough to lose.
    mode = ["modstage.mode=systemd", "no_timer_check"]
    return [*mode, *([f"modstage.tree={tree}"] if tree else [])]


def require_systemd(vm: Vm) -> None:
    """VmBootError unless PID 1 is systemd and has finished starting. A unit of the host's
    own that fails in the guest leaves it "degraded", which is allowed; a failed unit of the
    test bed (modstage's, the stand-ins, the agent) is not."""
    comm = vm.read("/proc/1/comm")
    if comm != "systemd":
        raise VmBootError(f"{vm.name}: PID 1 is {comm!r}, not systemd\n{vm.serial_tail()}")
    deadline = time.monotonic() + 60
    while (state := vm.run("systemctl is-system-running").stdout.strip()) in (
        "initializing",
        "starting",
    ) and time.monotonic() < deadline:
        time.sleep(1)
    failed = vm.run("systemctl --failed --no-legend --plain").stdout
    ours = ("modstage", "containerd.service", "kubelet.service")
    if state not in ("running", "degraded") or any(
        line.split()[0].startswith(ours) for line in failed.splitlines() if line.strip()
    ):
        raise VmBootError(f"{vm.name}: systemd is {state}; failed units:\n{failed}")


def show(vm: Vm, unit: str, *properties: str) -> dict[str, str]:
    """``systemctl show -p ...`` of one unit, as a dict."""
    out = vm.run(["systemctl", "show", unit, "-p", ",".join(properties)]).check().stdout
    return dict(line.split("=", 1) for line in out.splitlines() if "=" in line)


def journal(vm: Vm, unit: str, *, priority: str | None = None) -> list[dict[str, Any]]:
    """This boot's journal records of `unit` (journalctl -o json), optionally ``-p PRIORITY``."""
    argv = ["journalctl", "-b", "-u", unit, "-o", "json", "--no-pager"]
    argv += ["-p", priority] if priority else []
    out = vm.run(argv).check().stdout
    return [json.loads(line) for line in out.splitlines() if line.startswith("{")]


def events(records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """modstage's log events among journal records, each with journald's PRIORITY added."""
    found = []
    for record in records:
        message = record.get("MESSAGE")
        if isinstance(message, str) and message.startswith("{"):
            found.append({**json.loads(message), "PRIORITY": int(record["PRIORITY"])})
    return found


def poll(predicate: Callable[[], Any], timeout: float, what: str, every: float = 1.0) -> Any:
    """Call `predicate` until it returns something true; AssertionError naming `what`."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        assert time.monotonic() < deadline, f"timed out after {timeout:g} s waiting for {what}"
        time.sleep(every)

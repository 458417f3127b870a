"""`Vm`: one test node. Boot it, drive it through its guest agent, reboot it, hot-plug memory.

    with Vm.boot(state_dir, kernel_args=["module.sig_enforce=1"]) as vm:
        vm.run("uname -r").stdout
        vm.eval("finit_module('/var/lib/modstage/m.ko')")   # 0 or an errno
        vm.reboot()                                          # same state share, new boot id

A reboot ends qemu (`-no-reboot`) and the harness starts it again with the same state share,
which is what a node reboot is. Every wait has a deadline; when one passes, or the guest dies,
qemu is killed and the error carries the tail of the serial log.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from types import TracebackType
from typing import Any

from . import exports_cache, initramfs, process
from .accel import choose_accel
from .channel import Agent, Closed, Expired, JsonLines, Qmp
from .errors import CommandTimeout, GuestError, VmBootError, VmError, VmExited, VmTimeout
from .kernel import Kernel
from .qemu import GUEST_SHARE_DIR, GUEST_STATE_DIR, Machine, cpus_setting, parse_size
from .timing import record_boot, record_retry

BOOT_TIMEOUT = float(os.environ.get("MODSTAGE_VM_BOOT_TIMEOUT", "180"))
GRACE = 30.0  # extra host-side wait on top of a guest-side timeout


@dataclass(frozen=True)
class Result:
    """What a guest command did."""

    rc: int
    stdout: str
    stderr: str

    def check(self) -> Result:
        """Return self, or raise VmError naming the exit status and stderr."""
        if self.rc != 0:
            raise VmError(f"guest command exited {self.rc}: {self.stderr.strip()}")
        return self


class Vm:
    """A QEMU guest running Debian's kernel, the host's root read-only and a state share.

    `state_dir` (host) is mounted read-write at /var/lib/modstage in every boot of this Vm.
    `memory` is qemu's -m value (slots and maxmem allow hot-plug); `cpus` the vCPUs (default:
    `MODSTAGE_VM_CPUS`, see qemu.py); `accel` is "tcg" or "kvm" (default: `MODSTAGE_VM_ACCEL`,
    see accel.py); `boot_timeout` bounds each boot.
    With `state_disk` (an ext4 image from `disk.make_ext4_image`) /var/lib/modstage is that
    disk instead, so that `kill()` is a power cut for it, and `state_dir` is mounted at
    GUEST_SHARE_DIR (`share_dir`) for handing files in. `devices` are extra qemu `-device`
    values (PCI devices such as "edu"); `start`/`reboot` may change them for the next boot.
    With `root_disk` (another ext4 image) the root's changes are kept there across reboots.
    """

    def __init__(
        self,
        state_dir: Path,
        *,
        name: str = "vm",
        kernel_args: Sequence[str] = (),
        memory: str = "1G,slots=4,maxmem=4G",
        cpus: int | None = None,
        kernel: Kernel | None = None,
        accel: str | None = None,
        boot_timeout: float = BOOT_TIMEOUT,
        state_disk: Path | None = None,
        devices: Sequence[str] = (),
        root_disk: Path | None = None,
    ) -> None:
        kernel = kernel or Kernel.find()
        self.name = name
        self.state_dir = Path(state_dir).resolve()
        self.state_dir.mkdir(parents=True, exist_ok=True)
        exports_cache.seed(self.state_dir, kernel)
        self.machine = Machine(
            vmlinux=kernel.vmlinux(),
            initramfs=initramfs.build(kernel),
            state_dir=self.state_dir,
            kernel_args=tuple(kernel_args),
            memory=memory,
            cpus=cpus or cpus_setting(),
            accel=accel or choose_accel(),
            state_disk=None if state_disk is None else Path(state_disk).resolve(),
            root=kernel.root,
            devices=tuple(devices),
            root_disk=None if root_disk is None else Path(root_disk).resolve(),
        )
        self.kernel = kernel
        self.boot_timeout = boot_timeout
        self.boots = 0
        self.boot_seconds = 0.0
        self.boot_id = ""
        self._runtime = Path(tempfile.mkdtemp(prefix="msvm-"))  # short: socket paths max 107
        self._process: subprocess.Popen[bytes] | None = None
        self._agent: Agent | None = None
        self._qmp: Qmp | None = None
        self._dimms = 0

    @classmethod
    def boot(cls, state_dir: Path, **options: Any) -> Vm:
        """Create a Vm and boot it; raises VmSetupError or VmBootError if it cannot come up."""
        vm = cls(state_dir, **options)
        try:
            vm.start()
        except BaseException:
            vm.close()
            raise
        return vm

    # lifecycle --------------------------------------------------------------------------------

    @property
    def serial_path(self) -> Path:
        """The serial console log of the current (or last) boot."""
        return self._runtime / f"serial-{self.boots}.log"

    @property
    def serial_log(self) -> str:
        """The serial console of the current (or last) boot so far."""
        return self.serial_path.read_text(errors="replace") if self.serial_path.exists() else ""

    def serial_tail(self, lines: int = 40) -> str:
        """The last `lines` lines of the serial console, for error messages; after a panic,
        the lines from the panic message on (its call trace can be longer than `lines`)."""
        log = self.serial_log.splitlines()
        panic = next((i for i, line in enumerate(log) if "Kernel panic" in line), None)
        return "\n".join(log[panic : panic + lines] if panic is not None else log[-lines:])

    @property
    def running(self) -> bool:
        """Whether qemu is running."""
        return self._process is not None and self._process.poll() is None

    def start(
        self, kernel_args: Sequence[str] | None = None, devices: Sequence[str] | None = None
    ) -> None:
        """Boot (again) with the same state share; `kernel_args` replaces the extra arguments,
        `devices` the extra qemu devices."""
        if self.running:
            raise VmError(f"{self.name} is already running")
        if kernel_args is not None:
            self.machine = replace(self.machine, kernel_args=tuple(kernel_args))
        if devices is not None:
            self.machine = replace(self.machine, devices=tuple(devices))
        began = time.monotonic()
        try:
            hello = self._spawn()
        except VmBootError as exc:
            if not exc.guest_ended:
                raise
            # The guest ended by itself before its agent answered: nothing of the test had
            # run in it yet. Under TCG Debian 13's kernel does so now and then in early boot
            # (an oops in interrupt context, or a reset, seconds in); boot once more, say so.
            record_retry(self.name, exc.tail)
            hello = self._spawn()
        self.boot_id = str(hello["boot_id"])
        self.boot_seconds = time.monotonic() - began
        record_boot(self.name, self.boot_seconds, self.machine.accel)

    def _ended_by_itself(self, within: float = 5.0) -> bool:
        """Whether qemu exits on its own within ``within`` s (its socket closes first)."""
        assert self._process is not None
        try:
            self._process.wait(within)
        except subprocess.TimeoutExpired:
            return False
        return True

    def _spawn(self) -> dict[str, Any]:
        """Start qemu and wait for the agent's hello (a VmBootError if it never comes)."""
        self.boots += 1
        for sock in self._runtime.glob("*.sock"):
            sock.unlink()
        self._process = process.spawn(self.machine.argv(self._runtime), self.serial_path)
        self._qmp = None
        try:
            self._agent = Agent(JsonLines(self._runtime / "agent.sock", lambda: self.running))
            return self._agent.request("hello", self.boot_timeout)
        except (Closed, Expired) as exc:
            ended = isinstance(exc, Closed) and self._ended_by_itself()
            self.kill()
            tail = self.serial_tail()
            error = VmBootError(f"{self.name} did not boot: {exc}\n{tail}")
            error.guest_ended, error.tail = ended, tail
            raise error from exc

    def wait_exit(self, timeout: float = 60) -> int:
        """Wait for qemu to end by itself (poweroff, reboot, panic); returns its status."""
        if self._process is None:
            raise VmError(f"{self.name} was never started")
        try:
            return self._process.wait(timeout)
        except subprocess.TimeoutExpired:
            self.kill()
            tail = self.serial_tail()
            raise VmTimeout(f"{self.name} did not stop in {timeout:g} s\n{tail}") from None

    def reboot(
        self, kernel_args: Sequence[str] | None = None, devices: Sequence[str] | None = None
    ) -> None:
        """Reboot the guest (`reboot -f` from PID 1) and boot it again with the same state
        (`devices`: the extra qemu devices of the next boot, as if added while it was off)."""
        self._call("exit", 30, action="reboot")
        self.wait_exit()
        self.start(kernel_args, devices)

    def poweroff(self) -> None:
        """Power the guest off and wait for qemu to end."""
        self._call("exit", 30, action="poweroff")
        self.wait_exit()

    def kill(self) -> None:
        """Kill qemu (it leads its own process group) and wait for it."""
        process.kill(self._process)
        for channel in (self._agent, self._qmp):
            if channel is not None:
                channel.lines.close()
        self._agent = self._qmp = None

    def close(self) -> None:
        """Power off if running (kill if that fails) and remove the runtime directory."""
        if self.running:
            try:
                self.poweroff()
            except VmError:
                self.kill()
        self.kill()
        shutil.rmtree(self._runtime, ignore_errors=True)

    def __enter__(self) -> Vm:
        return self

    def __exit__(self, *exc: type[BaseException] | BaseException | TracebackType | None) -> None:
        self.close()

    # guest calls ------------------------------------------------------------------------------

    def _call(self, op: str, wait: float, **fields: Any) -> dict[str, Any]:
        if self._agent is None or not self.running:
            raise VmExited(f"{self.name} is not running\n{self.serial_tail()}", self.returncode)
        try:
            return self._agent.request(op, wait, **fields)
        except Closed as exc:
            self.wait_exit(10)
            tail = self.serial_tail()
            message = f"{self.name} exited during {op}: {exc}\n{tail}"
            raise VmExited(message, self.returncode) from exc
        except Expired as exc:
            self.kill()
            tail = self.serial_tail()
            raise VmTimeout(f"{self.name}: {op} got {exc}; VM killed\n{tail}") from exc

    @property
    def returncode(self) -> int | None:
        """qemu's exit status once it has ended."""
        return None if self._process is None else self._process.poll()

    def run(
        self,
        command: str | Sequence[str],
        *,
        timeout: float = 60,
        input: str | None = None,
        cwd: str | None = None,
        env: dict[str, str] | None = None,
    ) -> Result:
        """Run a shell command (str) or argv in the guest; CommandTimeout if it overruns."""
        reply = self._call(
            "run",
            timeout + GRACE,
            timeout=timeout,
            input=input,
            cwd=cwd,
            env=env or {},
            command=command if isinstance(command, str) else list(command),
        )
        if "traceback" in reply:
            raise GuestError(reply["traceback"])
        if reply.get("timed_out"):
            shown = command if isinstance(command, str) else " ".join(command)
            raise CommandTimeout(shown, timeout, reply["stdout"], reply["stderr"])
        return Result(int(reply["rc"]), reply["stdout"], reply["stderr"])

    def python(self, code: str, *, timeout: float = 60) -> str:
        """exec `code` in the agent's namespace (kept for the boot); returns what it printed."""
        return str(self._python("exec", code, timeout)["stdout"])

    def eval(self, expression: str, *, timeout: float = 60) -> Any:
        """Evaluate a Python expression in the agent's namespace; returns its JSON value."""
        return self._python("eval", expression, timeout)["value"]

    def _python(self, op: str, code: str, timeout: float) -> dict[str, Any]:
        reply = self._call(op, timeout + GRACE, code=code, timeout=timeout)
        if reply.get("timed_out"):
            raise CommandTimeout(code, timeout, reply["stdout"], reply["stderr"])
        if "traceback" in reply:
            raise GuestError(reply["traceback"])
        return reply

    def read(self, path: str) -> str:
        """The text of a guest file, without its trailing newline (sysfs, procfs)."""
        return str(self.eval(f"read({path!r})"))

    # files and devices ------------------------------------------------------------------------

    @property
    def share_dir(self) -> str:
        """Where the guest sees `state_dir`: /var/lib/modstage, or elsewhere with a state disk."""
        return GUEST_STATE_DIR if self.machine.state_disk is None else GUEST_SHARE_DIR

    def guest_path(self, host_path: Path) -> str:
        """Where a host path under the state directory appears in the guest."""
        relative = Path(host_path).resolve().relative_to(self.state_dir)
        return self.share_dir if relative == Path() else f"{self.share_dir}/{relative}"

    def put(self, source: Path, relative: str) -> str:
        """Copy a host file onto the state share at `relative`; returns its guest path."""
        target = self.state_dir / relative
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(source, target)
        return self.guest_path(target)

    def qmp(self, command: str, **arguments: Any) -> Any:
        """Run a QMP command against this boot's qemu."""
        if not self.running:
            raise VmExited(f"{self.name} is not running", self.returncode)
        if self._qmp is None:
            self._qmp = Qmp(JsonLines(self._runtime / "qmp.sock", lambda: self.running))
        return self._qmp.execute(command, **arguments)

    def hotplug_memory(self, size: str | int) -> str:
        """Hot-add a DIMM of `size` ("512M", "1G" or bytes); returns the device id."""
        self._dimms += 1
        backend, dimm = f"mem{self.boots}-{self._dimms}", f"dimm{self.boots}-{self._dimms}"
        self.qmp(
            "object-add", **{"qom-type": "memory-backend-ram", "id": backend}, size=parse_size(size)
        )
        self.qmp("device_add", driver="pc-dimm", id=dimm, memdev=backend)
        return dimm


VmFactory = Callable[..., Vm]
"""What the `boot_vm` fixture returns: `boot_vm(name, **Vm options) -> Vm`, booted."""

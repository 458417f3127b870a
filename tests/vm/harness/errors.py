"""Errors raised by the VM harness.

    VmError                    root of everything below
    ├── VmSetupError           the host cannot build or start the VM (qemu, kernel, busybox missing)
    ├── VmBootError            qemu started but the guest agent never answered
    ├── VmTimeout              a guest call did not answer in time; the VM was killed
    ├── VmExited               qemu ended while a call was waiting (panic, poweroff, crash)
    ├── CommandTimeout         a guest command ran past its timeout; the VM is still usable
    └── GuestError             Python code raised inside the guest agent

Every error that ends a VM carries the tail of its serial log in its message, so a failing test
shows what the guest kernel said.
"""

from __future__ import annotations


class VmError(Exception):
    """Root of the harness's errors."""


class VmSetupError(VmError):
    """The host lacks something the VM needs (qemu, the kernel image, busybox, a module)."""


class VmBootError(VmError):
    """The guest did not come up: qemu died or the agent never answered.

    ``guest_ended``: qemu ended by itself (a panic, a reset) before the agent answered;
    ``tail``: the console's last lines.
    """

    guest_ended: bool = False
    tail: str = ""


class VmTimeout(VmError):
    """A call into the guest did not complete in time; the VM has been killed."""


class VmExited(VmError):
    """qemu exited while the harness was waiting on the guest."""

    def __init__(self, message: str, returncode: int | None) -> None:
        super().__init__(message)
        self.returncode = returncode


class CommandTimeout(VmError):
    """A guest command exceeded its timeout and was killed; the guest itself is fine."""

    def __init__(self, command: str, timeout: float, stdout: str, stderr: str) -> None:
        super().__init__(f"guest command timed out after {timeout:g} s: {command}")
        self.command = command
        self.timeout = timeout
        self.stdout = stdout
        self.stderr = stderr


class GuestError(VmError):
    """Python code evaluated in the guest raised; `guest_traceback` is the guest's traceback."""

    def __init__(self, guest_traceback: str) -> None:
        last = guest_traceback.strip().splitlines()[-1] if guest_traceback.strip() else "?"
        super().__init__(f"guest raised {last}\n{guest_traceback}")
        self.guest_traceback = guest_traceback

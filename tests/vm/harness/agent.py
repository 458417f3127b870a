"""The guest agent: one long-running Python process per boot that executes the host's requests.

It runs inside the VM (started by init.sh, chrooted into the overlay of the host's root) and is
deliberately standard-library only, because Python starts slowly under TCG. Requests and replies
are JSON lines over the virtio-serial port named `modstage.agent`; the host always speaks first,
so nothing is written before the host is connected. Code sent with `exec`/`eval` runs in one
namespace that lives as long as the boot, pre-seeded with the helpers defined below.

Exit status 0 asks PID 1 to power off, 100 to reboot.
"""

from __future__ import annotations

import contextlib
import errno
import io
import json
import os
import signal
import subprocess
import sys
import time
import traceback
from collections.abc import Callable
from typing import Any

PORT_NAME = "modstage.agent"
REBOOT_STATUS = 100
SYS_FINIT_MODULE = 313  # x86_64
SYS_DELETE_MODULE = 176


def finit_module(path: str, params: str = "", flags: int = 0) -> int:
    """Load the module at `path` with finit_module(2); 0 on success, else the errno."""
    import ctypes

    libc = ctypes.CDLL(None, use_errno=True)
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    try:
        rc = libc.syscall(SYS_FINIT_MODULE, fd, params.encode(), flags)
        return 0 if rc == 0 else ctypes.get_errno()
    finally:
        os.close(fd)


def delete_module(name: str, flags: int = os.O_NONBLOCK) -> int:
    """Unload module `name` with delete_module(2); 0 on success, else the errno."""
    import ctypes

    libc = ctypes.CDLL(None, use_errno=True)
    rc = libc.syscall(SYS_DELETE_MODULE, name.encode(), flags)
    return 0 if rc == 0 else ctypes.get_errno()


def read(path: str) -> str:
    """The text of `path` without its trailing newline (sysfs and procfs values)."""
    with open(path) as f:
        return f.read().rstrip("\n")


def write(path: str, text: str) -> None:
    """Write `text` to `path` in one write(2), as sysfs wants."""
    with open(path, "w") as f:
        f.write(text)


class _Deadline(Exception):
    pass


def _alarm(_signum: int, _frame: object) -> None:
    raise _Deadline


def run(request: dict[str, Any]) -> dict[str, Any]:
    """Run a command; report its status and output, or that it timed out."""
    command = request["command"]
    try:
        done = subprocess.run(
            command,
            shell=isinstance(command, str),
            input=None if request.get("input") is None else request["input"].encode(),
            capture_output=True,
            timeout=request["timeout"],
            cwd=request.get("cwd"),
            env={**os.environ, **request.get("env", {})},
            check=False,
        )
    except subprocess.TimeoutExpired as exc:
        return {"timed_out": True, "stdout": _text(exc.stdout), "stderr": _text(exc.stderr)}
    except OSError as exc:
        return {"rc": 127, "stdout": "", "stderr": f"{exc}\n"}
    return {"rc": done.returncode, "stdout": _text(done.stdout), "stderr": _text(done.stderr)}


def _text(data: bytes | str | None) -> str:
    if isinstance(data, bytes):
        return data.decode(errors="replace")
    return data or ""


def evaluate(request: dict[str, Any], namespace: dict[str, Any]) -> dict[str, Any]:
    """exec or eval Python code in the boot's namespace, with a deadline and captured output."""
    out, err = io.StringIO(), io.StringIO()
    signal.signal(signal.SIGALRM, _alarm)
    signal.setitimer(signal.ITIMER_REAL, request["timeout"])
    reply: dict[str, Any] = {}
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            if request["op"] == "eval":
                reply["value"] = eval(request["code"], namespace)
                json.dumps(reply["value"])
            else:
                exec(compile(request["code"], "<vm.python>", "exec"), namespace)
    except _Deadline:
        reply = {"timed_out": True}
    except BaseException:
        reply = {"traceback": traceback.format_exc()}
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
    return {**reply, "stdout": out.getvalue(), "stderr": err.getvalue()}


def open_port(name: str = PORT_NAME, wait: float = 30.0) -> int:
    """Open the virtio-serial port called `name` (there is no udev to make a symlink)."""
    deadline = time.monotonic() + wait
    while True:
        for entry in sorted(os.listdir("/sys/class/virtio-ports")):
            if read(f"/sys/class/virtio-ports/{entry}/name") == name:
                return os.open(f"/dev/{entry}", os.O_RDWR | os.O_CLOEXEC)
        if time.monotonic() > deadline:
            raise SystemExit(f"agent: no virtio port named {name}")
        time.sleep(0.1)


def serve(fd: int, namespace: dict[str, Any]) -> int:
    """Answer requests until asked to power off or reboot; returns the exit status."""
    buffer = b""
    handlers: dict[str, Callable[[dict[str, Any]], dict[str, Any]]] = {
        "hello": lambda _r: {"boot_id": read("/proc/sys/kernel/random/boot_id")},
        "run": run,
        "exec": lambda r: evaluate(r, namespace),
        "eval": lambda r: evaluate(r, namespace),
        "exit": lambda r: {"status": REBOOT_STATUS if r["action"] == "reboot" else 0},
    }
    while True:
        while b"\n" not in buffer:
            chunk = os.read(fd, 65536)
            if not chunk:
                time.sleep(0.05)  # host not connected (yet, or any more)
            buffer += chunk
        line, buffer = buffer.split(b"\n", 1)
        request = json.loads(line)
        try:
            reply = {"id": request["id"], **handlers[request["op"]](request)}
        except Exception:  # a harness bug must not take the agent down
            reply = {"id": request["id"], "traceback": traceback.format_exc()}
        data = json.dumps(reply).encode() + b"\n"
        while data:
            data = data[os.write(fd, data) :]
        if request["op"] == "exit":
            return int(reply["status"])


def main() -> None:
    """Entry point: `python agent.py REPO`."""
    repo = sys.argv[1] if len(sys.argv) > 1 else "/"
    os.chdir(repo)
    sys.path.insert(0, repo)
    namespace: dict[str, Any] = {"__name__": "__vm__", "errno": errno, "os": os}
    for helper in (finit_module, delete_module, read, write):
        namespace[helper.__name__] = helper
    sys.exit(serve(open_port(), namespace))


if __name__ == "__main__":
    main()

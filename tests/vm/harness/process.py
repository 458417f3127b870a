"""The qemu process: started in its own process group, tied to the life of the test process.

qemu leads its own process group so that killing it never touches the test runner, and it
receives SIGKILL if the process that started it dies (PR_SET_PDEATHSIG), so an interrupted or
crashed test run leaves no orphaned VM behind.
"""

from __future__ import annotations

import ctypes
import os
import signal
import subprocess
from collections.abc import Sequence
from pathlib import Path

PR_SET_PDEATHSIG = 1


def _die_with_parent() -> None:
    """In the forked child, before exec: ask for SIGKILL when the parent goes away."""
    ctypes.CDLL(None).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)


def spawn(argv: Sequence[str], log: Path) -> subprocess.Popen[bytes]:
    """Start `argv` with stdin closed and stdout+stderr (the serial console) written to `log`."""
    with log.open("wb") as out:
        return subprocess.Popen(
            list(argv),
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            preexec_fn=_die_with_parent,
        )


def kill(process: subprocess.Popen[bytes] | None) -> None:
    """SIGKILL the process's group if it is still running, and reap it."""
    if process is not None and process.poll() is None:
        os.killpg(process.pid, signal.SIGKILL)
        process.wait()

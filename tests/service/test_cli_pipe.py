"""A reader that stops early (``modstage status --json | head``) ends modstage quietly: exit
141 (128 + SIGPIPE, as ``cat`` killed by SIGPIPE shows in a shell), no traceback."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from service.bundles.state import State
from service.cli import EXIT_BROKEN_PIPE
from tests.service.test_reboot_required import host, pending

REPO = Path(__file__).resolve().parents[2]
COMMANDS = [["status", "--json"], ["generations", "--json"], ["boot", "--dry-run"], ["status"]]


@pytest.mark.parametrize("argv", COMMANDS, ids=[" ".join(c) for c in COMMANDS])
def test_a_pipe_closed_by_its_reader_ends_quietly(tmp_path: Path, argv: list[str]) -> None:
    """stdout is a real pipe whose read end is closed before modstage writes: the write
    fails with EPIPE, and modstage exits 141 with no traceback and no BrokenPipeError."""
    host(tmp_path, State({"nvidia": pending()}))
    read_end, write_end = os.pipe()
    os.close(read_end)  # the reader is gone before the first line is written
    try:
        done = subprocess.run(
            [sys.executable, "-m", "service.cli", *argv, "--root", str(tmp_path)],
            stdout=write_end,
            stderr=subprocess.PIPE,
            text=True,
            cwd=REPO,
            check=False,
            timeout=120,
        )
    finally:
        os.close(write_end)
    assert done.returncode == EXIT_BROKEN_PIPE == 141, done.stderr
    assert "Traceback" not in done.stderr and "BrokenPipe" not in done.stderr, done.stderr


def test_a_broken_pipe_that_is_not_stdouts_is_not_hidden(tmp_path: Path) -> None:
    """An EPIPE raised by something other than stdout (a child's pipe, a socket) while
    stdout is fine is an error like any other: a traceback and exit 1, not a quiet 141."""
    probe = (
        "import sys\n"
        "import service.cli as cli\n"
        "def broken(argv=None, out=None):\n"
        "    raise BrokenPipeError(32, 'Broken pipe')\n"
        "cli.main = broken\n"
        "cli.entry()\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", probe],
        capture_output=True,
        text=True,
        cwd=REPO,
        check=False,
        timeout=120,
    )
    assert done.returncode == 1 and "BrokenPipeError" in done.stderr, done

"""The test-only switch of ``stager.atomic``: ``MODSTAGE_FAULT_SKIP_FSYNC=1`` skips the fsyncs.

Each case runs in a fresh interpreter, because the switch is read once, at import; it counts
the calls of ``os.fsync`` there (the standard library's, not ours).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PROBE = """
import json, os, sys
from pathlib import Path
calls = []
real_fsync = os.fsync
os.fsync = lambda fd: (calls.append(fd), real_fsync(fd))[1]
from stager import atomic
os.environ[atomic.SKIP_FSYNC_ENV] = sys.argv[2]  # too late: read at import
target = Path(sys.argv[1])
atomic.write_atomic(target, b"new")
after_write = len(calls)
atomic.fsync_dir(target.parent)
print(json.dumps([after_write, len(calls), sorted(p.name for p in target.parent.iterdir())]))
"""


def _probe(tmp_path: Path, switch: str | None, later: str = "") -> list[object]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("MODSTAGE_FAULT")}
    if switch is not None:
        env["MODSTAGE_FAULT_SKIP_FSYNC"] = switch
    target = tmp_path / "state.json"
    target.write_bytes(b"old")
    out = subprocess.run(
        [sys.executable, "-c", PROBE, str(target), later],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        check=True,
    )
    assert target.read_bytes() == b"new"
    result: list[object] = json.loads(out.stdout)
    return result


@pytest.mark.parametrize("switch", [None, "", "0", "yes"])
def test_without_the_switch_both_functions_fsync(tmp_path: Path, switch: str | None) -> None:
    """Unset (or not 1): the write fsyncs its file and the directory, fsync_dir the directory."""
    assert _probe(tmp_path, switch) == [2, 3, ["state.json"]]


def test_the_switch_skips_every_fsync_but_still_replaces(tmp_path: Path) -> None:
    """``=1``: no fsync at all, and the rename still happens (no temporary file left)."""
    assert _probe(tmp_path, "1") == [0, 0, ["state.json"]]


def test_the_switch_is_read_once_at_import(tmp_path: Path) -> None:
    """Setting the variable after the import changes nothing."""
    assert _probe(tmp_path, None, later="1") == [2, 3, ["state.json"]]

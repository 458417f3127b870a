"""The test-only switch of ``stager.schema.atomic``: ``MODSTAGE_FAULT_SKIP_FSYNC=1`` skips the fsyncs.

Each case runs in a fresh interpreter, because the switch is read once, at import; it counts
the calls of ``os.fsync`` there (the standard library's, not ours). The write itself, without
the switch, is checked in this interpreter: what each fsync made durable, in which order, and
that a failed write leaves nothing behind.
"""

from __future__ import annotations

import errno
import json
import os
import re
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from stager.schema import atomic

ROOT = Path(__file__).resolve().parents[2]
PROBE = """
import json, os, sys
from pathlib import Path
calls = []
real_fsync = os.fsync
os.fsync = lambda fd: (calls.append(fd), real_fsync(fd))[1]
from stager.schema import atomic
os.environ[atomic.SKIP_FSYNC_ENV] = sys.argv[2]  # too late: read at import
target = Path(sys.argv[1])
atomic.write_atomic(target, b"new")
after_write = len(calls)
atomic.fsync_dir(target.parent)
after_dir = len(calls)
with open(target, "rb") as copied:  # a copied module's descriptor
    atomic.fsync_file(copied.fileno())
names = sorted(p.name for p in target.parent.iterdir())
print(json.dumps([after_write, after_dir, len(calls), names]))
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
    """Unset (or not 1): the write fsyncs its file and the directory, fsync_dir the
    directory, fsync_file the file."""
    assert _probe(tmp_path, switch) == [2, 3, 4, ["state.json"]]


def test_the_switch_skips_every_fsync_but_still_replaces(tmp_path: Path) -> None:
    """``=1``: no fsync at all, from any of the three, and the rename still happens (no
    temporary file left)."""
    assert _probe(tmp_path, "1") == [0, 0, 0, ["state.json"]]


def test_the_switch_is_read_once_at_import(tmp_path: Path) -> None:
    """Setting the variable after the import changes nothing."""
    assert _probe(tmp_path, None, later="1") == [2, 3, 4, ["state.json"]]


def _fsync_calls(path: Path) -> list[int]:
    """The lines of ``path`` that call ``os.fsync`` (as ``os.fsync(...)`` or a bare
    ``fsync(...)`` imported from os)."""
    import ast

    tree = ast.parse(path.read_text(), str(path))
    from_os = {
        alias.asname or alias.name
        for node in ast.walk(tree)
        if isinstance(node, ast.ImportFrom) and node.module == "os"
        for alias in node.names
        if alias.name == "fsync"
    }
    lines = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call):
            continue
        func = node.func
        if isinstance(func, ast.Attribute) and func.attr == "fsync":
            if isinstance(func.value, ast.Name) and func.value.id == "os":
                lines.append(node.lineno)
        elif isinstance(func, ast.Name) and func.id in from_os:
            lines.append(node.lineno)
    return lines


def test_every_fsync_of_the_product_goes_through_the_switch() -> None:
    """No module of ``service/`` or ``stager/`` but ``stager/schema/atomic.py`` calls ``os.fsync``:
    every durable write (state, status files, the store's directories, copied modules, a
    drop's files) is made durable by ``stager.schema.atomic``, so the power-cut control's switch
    (tests/vm/test_power_cut.py) skips all of them and the durability claim rests on each."""
    callers = {
        str(path.relative_to(ROOT)): lines
        for package in ("service", "stager")
        for path in sorted((ROOT / package).rglob("*.py"))
        if path != ROOT / "stager/schema/atomic.py" and (lines := _fsync_calls(path))
    }
    assert callers == {}, f"os.fsync called outside stager/schema/atomic.py: {callers}"
    assert _fsync_calls(ROOT / "stager/schema/atomic.py"), (
        "the finder must see atomic.py's own fsync"
    )


class Fsyncs:
    """``os.fsync`` (the standard library's) recording what each call made durable: the
    descriptor's inode and the path it was opened by, in call order."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.calls: list[tuple[int, str]] = []
        real = os.fsync

        def fsync(fd: int) -> None:
            self.calls.append((os.fstat(fd).st_ino, os.readlink(f"/proc/self/fd/{fd}")))
            real(fd)

        monkeypatch.setattr(os, "fsync", fsync)


@pytest.fixture
def fsyncs(monkeypatch: pytest.MonkeyPatch) -> Fsyncs:
    """Every ``os.fsync`` of the test, recorded (none skipped by the test-only switch)."""
    assert not atomic._SKIP_FSYNC
    return Fsyncs(monkeypatch)


def test_the_file_is_fsynced_before_its_rename_then_its_directory(
    tmp_path: Path, fsyncs: Fsyncs
) -> None:
    """The data reaches the disk under its temporary name (the inode that becomes the file),
    then the directory holding the new name: two fsyncs, in that order, of those two."""
    target = tmp_path / "state.json"
    target.write_bytes(b"old")
    atomic.write_atomic(target, b"new")
    [(file_ino, file_path), directory] = fsyncs.calls
    assert file_ino == target.stat().st_ino and file_ino != directory[0]
    assert re.fullmatch(
        rf"{re.escape(str(tmp_path))}/\.state\.json\.[0-9a-f]{{12}}\.tmp", file_path
    )
    assert directory == (tmp_path.stat().st_ino, str(tmp_path))


@pytest.mark.parametrize("fails", ["fsync", "before_replace"])
def test_a_failed_write_leaves_no_temporary_file_and_the_old_content(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, fails: str
) -> None:
    """A write whose fsync fails (EIO), or that is stopped just before its rename, raises
    that error, removes its temporary file and leaves the file as it was."""
    target = tmp_path / "state.json"
    target.write_bytes(b"old")

    def eio(fd: int) -> None:
        raise OSError(errno.EIO, "Input/output error")

    def stop() -> None:
        raise KeyboardInterrupt

    if fails == "fsync":
        monkeypatch.setattr(os, "fsync", eio)
    with pytest.raises(OSError if fails == "fsync" else KeyboardInterrupt):
        atomic.write_atomic(target, b"new", before_replace=stop)
    assert [p.name for p in tmp_path.iterdir()] == ["state.json"]
    assert target.read_bytes() == b"old"


def test_the_mode_is_exact_whatever_the_umask_and_no_descriptor_is_left(tmp_path: Path) -> None:
    """The file gets ``mode`` (0644 unless told) under any umask, and neither the write nor
    fsync_dir leaves a descriptor open."""
    fds = set(os.listdir("/proc/self/fd"))
    old = os.umask(0o077)
    try:
        atomic.write_atomic(tmp_path / "status.json", b"{}")
        atomic.write_atomic(tmp_path / "manifest.toml", b"", mode=0o444)
        atomic.fsync_dir(tmp_path)
    finally:
        os.umask(old)
    assert set(os.listdir("/proc/self/fd")) == fds
    assert stat.S_IMODE((tmp_path / "status.json").stat().st_mode) == 0o644
    assert stat.S_IMODE((tmp_path / "manifest.toml").stat().st_mode) == 0o444


def test_a_file_already_at_the_temporary_name_is_never_written_through(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The temporary file is created, never opened: a file found at its name (a hard link to
    another file, were the random name guessed) fails the write (EEXIST) and is left as it was."""
    monkeypatch.setattr(os, "urandom", lambda n: bytes(n))
    victim = tmp_path / "victim"
    victim.write_bytes(b"precious")
    os.link(victim, tmp_path / f".state.json.{bytes(6).hex()}.tmp")
    with pytest.raises(FileExistsError):
        atomic.write_atomic(tmp_path / "state.json", b"new")
    assert victim.read_bytes() == b"precious" and not (tmp_path / "state.json").exists()

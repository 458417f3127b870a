"""The one crash-safe write: temp file in the same directory, fsync, rename, fsync the directory.

Every file modstage persists whole (manifests, state, status, metrics) goes through
:func:`write_atomic`, so a reader sees either the old content or the new one,
whatever moment the writer is killed at. Copied module and firmware files are
fsynced by their copier and published by renaming their directory, once
:func:`fsync_dir` made its entries durable.

Every fsync modstage makes goes through this module (:func:`fsync_file`, :func:`fsync_dir`,
:func:`write_atomic`; ``tests/stager/test_atomic_faults.py`` checks that no other product
module calls ``os.fsync``). ``MODSTAGE_FAULT_SKIP_FSYNC=1`` is a test-only switch: the test
sets it, the product never does. Read once, when this module is imported, it makes all three
skip their fsyncs (the writes and renames still happen), so the power-cut test
(tests/vm/test_power_cut.py) can show that it catches a durable write that is not, whichever
write it is: the state, the status files, the store's directories or the copied modules.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

SKIP_FSYNC_ENV = "MODSTAGE_FAULT_SKIP_FSYNC"
_SKIP_FSYNC = os.environ.get(SKIP_FSYNC_ENV) == "1"


def fsync_file(fd: int) -> None:
    """Make the data of the open file ``fd`` durable (a copied module, a drop's file)."""
    if not _SKIP_FSYNC:
        os.fsync(fd)


def fsync_dir(path: Path) -> None:
    """Make the directory entries of ``path`` durable."""
    if _SKIP_FSYNC:
        return
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_atomic(
    path: Path, data: bytes, mode: int = 0o644, *, before_replace: Callable[[], None] | None = None
) -> None:
    """Replace ``path`` with ``data`` atomically and durably.

    The temporary name starts with a dot and ends in ``.tmp`` so that scanners
    can tell it from a finished file; a crash leaves at most such a file behind.
    ``before_replace`` runs once the temporary file is durable, just before the
    rename (the host's crash tests inject a kill there).
    """
    tmp = path.with_name(f".{path.name}.{os.urandom(6).hex()}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC | os.O_NOFOLLOW, mode)
    try:
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view) :]
            os.fchmod(fd, mode)
            fsync_file(fd)
        finally:
            os.close(fd)
        if before_replace is not None:
            before_replace()
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    fsync_dir(path.parent)

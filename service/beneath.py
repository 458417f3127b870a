"""Open regular files beneath a directory without following symbolic links.

A drop directory is written by a container: any component of a path in it may be a
symlink planted to make the host read something else, and the file itself may be a FIFO
or a device node whose ``open`` has effects. :func:`open_beneath` walks the path one
component at a time, relative to directory descriptors, with ``O_NOFOLLOW``; it opens
the last component with ``O_PATH`` (which reads nothing and runs no driver), lets the
caller check that inode, and only then reopens that very inode for reading through
``/proc/self/fd``. Intake (``dropfs``) and ``modstage verify`` both open drop files this way.
"""

from __future__ import annotations

import errno
import os
import stat
from collections.abc import Callable
from pathlib import Path
from typing import BinaryIO

#: Open a directory of a drop: never through a symbolic link.
DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_PATH_FLAGS = os.O_PATH | os.O_NOFOLLOW | os.O_CLOEXEC
# No O_NOFOLLOW here: /proc/self/fd/N is a magic link to the inode already checked.
_READ_FLAGS = os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC
_FD_DIR = "/proc/self/fd"  # the process's own descriptors, not a fact about the host

Check = Callable[[os.stat_result], None]


def open_beneath(dir_fd: int, relative: str, check: Check) -> int:
    """Open ``relative`` beneath ``dir_fd`` for reading once ``check(stat)`` accepts it.

    Raises ``OSError`` for the walk (``ELOOP``: a symlink, ``ENOTDIR``, ``ENOENT``) and
    whatever ``check`` raises; the returned descriptor is blocking.
    """
    if any(part in ("", ".", "..") for part in relative.split("/")):
        raise OSError(errno.EINVAL, "path must be relative and normalized", relative)
    fd = os.dup(dir_fd)
    try:
        *dirs, last = relative.split("/")
        for part in dirs:
            sub = os.open(part, DIR_FLAGS, dir_fd=fd)
            os.close(fd)
            fd = sub
        parent, fd = fd, os.open(last, _PATH_FLAGS, dir_fd=fd)
        os.close(parent)
        check(os.fstat(fd))
        readable = os.open(f"{_FD_DIR}/{fd}", _READ_FLAGS)
    finally:
        os.close(fd)
    try:
        os.set_blocking(readable, True)
    except BaseException:
        os.close(readable)
        raise
    return readable


def _regular(st: os.stat_result) -> None:
    if stat.S_ISLNK(st.st_mode):  # O_PATH|O_NOFOLLOW opens a final symlink itself
        raise OSError(errno.ELOOP, "is a symbolic link")
    if not stat.S_ISREG(st.st_mode):
        raise OSError(errno.EINVAL, "not a regular file")


def open_regular(root: Path, relative: str, *, follow: bool) -> BinaryIO:
    """Open a regular file; unless ``follow``, no component of ``relative`` may be a symlink."""
    if follow:
        fd = os.open(root / relative, _READ_FLAGS)
        try:
            _regular(os.fstat(fd))
            os.set_blocking(fd, True)
        except BaseException:
            os.close(fd)
            raise
    else:
        top = os.open(root, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        try:
            fd = open_beneath(top, relative, _regular)
        finally:
            os.close(top)
    return os.fdopen(fd, "rb", buffering=0)

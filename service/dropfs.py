"""Reading a drop written by a container, trusting none of it.

Every open is relative to a directory descriptor, one component at a time,
with ``O_NOFOLLOW`` (a symlink anywhere is refused), ``O_NONBLOCK`` (a planted
FIFO cannot block the reader) and ``O_NOCTTY``; only regular files with a single
link and a size within the limit are accepted. Errors are :class:`DropError`
naming the file and the reason in plain words.
"""

from __future__ import annotations

import errno
import os
import stat
from pathlib import Path

from service.errors import DropError

_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_FILE_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC


def _why(exc: OSError) -> str:
    if exc.errno == errno.ELOOP:
        return "is a symbolic link"
    if exc.errno == errno.ENOTDIR:
        return "a directory on its path is not a directory (or is a symbolic link)"
    if exc.errno == errno.ENOENT:
        return "does not exist"
    return exc.strerror or str(exc)


def open_dir(path: Path) -> int:
    """Open the drop directory itself (the last component must not be a symlink)."""
    try:
        return os.open(path, _DIR_FLAGS)
    except OSError as exc:
        raise DropError(path, _why(exc)) from exc


def open_file(dir_fd: int, relative: str, *, display: Path, max_bytes: int) -> int:
    """Open ``relative`` beneath ``dir_fd`` as a checked regular file; return its fd."""
    fd = os.dup(dir_fd)
    try:
        *dirs, last = relative.split("/")
        for part in dirs:
            sub = os.open(part, _DIR_FLAGS, dir_fd=fd)
            os.close(fd)
            fd = sub
        parent, fd = fd, os.open(last, _FILE_FLAGS, dir_fd=fd)
        os.close(parent)
    except OSError as exc:
        os.close(fd)
        raise DropError(display / relative, _why(exc)) from exc
    try:
        check_regular(os.fstat(fd), display / relative, max_bytes)
        os.set_blocking(fd, True)
    except BaseException:
        os.close(fd)
        raise
    return fd


def check_regular(st: os.stat_result, display: Path, max_bytes: int) -> None:
    """Refuse anything but a singly linked regular file of at most ``max_bytes``."""
    if not stat.S_ISREG(st.st_mode):
        kind = {
            stat.S_IFIFO: "a FIFO",
            stat.S_IFSOCK: "a socket",
            stat.S_IFCHR: "a device node",
            stat.S_IFBLK: "a device node",
            stat.S_IFDIR: "a directory",
        }.get(stat.S_IFMT(st.st_mode), "not a regular file")
        raise DropError(display, f"is {kind}, not a regular file")
    if st.st_nlink != 1:
        raise DropError(display, f"has {st.st_nlink} hard links (a drop file must have one)")
    if st.st_size > max_bytes:
        raise DropError(display, f"is {st.st_size} bytes, over the limit of {max_bytes}")


def read_small(dir_fd: int, relative: str, *, display: Path, max_bytes: int) -> bytes:
    """Read a whole small file (the manifest) beneath ``dir_fd``."""
    fd = open_file(dir_fd, relative, display=display, max_bytes=max_bytes)
    try:
        data = os.read(fd, max_bytes + 1)
    finally:
        os.close(fd)
    if len(data) > max_bytes:
        raise DropError(display / relative, f"grew beyond the limit of {max_bytes} bytes")
    return data

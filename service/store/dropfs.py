"""Reading a drop written by a container, trusting none of it.

Files are opened with :func:`service.beneath.open_beneath` (no symlink followed,
the inode checked through ``O_PATH`` before it is opened for reading); only regular
files with a single link and a size within the limit pass the check. A planted
FIFO, device node or hard link to a file outside the drop is therefore never
opened at all. Errors are :class:`DropError` naming the file and the reason in
plain words.
"""

from __future__ import annotations

import errno
import os
import stat
from pathlib import Path

from service.beneath import open_beneath
from service.errors import DropError

_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


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
        why = "is a symbolic link" if os.path.islink(path) else _why(exc)
        raise DropError(path, why) from exc


def open_file(
    dir_fd: int, relative: str, *, display: Path, max_bytes: int, limit: str | None = None
) -> int:
    """Open ``relative`` beneath ``dir_fd`` as a checked regular file; return its fd.

    ``limit`` words which limit ``max_bytes`` is, for the error (default: "the limit").
    """
    path = display / relative
    try:
        return open_beneath(dir_fd, relative, lambda st: check_regular(st, path, max_bytes, limit))
    except OSError as exc:
        raise DropError(path, _why(exc)) from exc


def check_regular(
    st: os.stat_result, display: Path, max_bytes: int, limit: str | None = None
) -> None:
    """Refuse anything but a singly linked regular file of at most ``max_bytes``."""
    if stat.S_ISLNK(st.st_mode):
        raise DropError(display, "is a symbolic link")
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
        over = limit or f"the limit of {max_bytes}"
        raise DropError(display, f"is {st.st_size} bytes, over {over}")


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

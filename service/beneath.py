"""Open regular files beneath a directory without following symbolic links.

A drop directory is written by a container: any component of a path in it may be a
symlink planted to make the host read something else. :func:`open_regular` walks the
path one component at a time, relative to directory descriptors, with ``O_NOFOLLOW``,
and accepts only a regular file (``O_NONBLOCK`` keeps a planted FIFO from blocking).
"""

from __future__ import annotations

import errno
import os
import stat
from pathlib import Path
from typing import BinaryIO


def open_regular(root: Path, relative: str, *, follow: bool) -> BinaryIO:
    """Open a regular file; unless ``follow``, no component of ``relative`` may be a symlink."""
    flags = os.O_RDONLY | os.O_CLOEXEC | os.O_NONBLOCK
    if not follow and any(part in ("", ".", "..") for part in relative.split("/")):
        raise OSError(errno.EINVAL, "path must be relative and normalized", relative)
    if follow:
        fd = os.open(root / relative, flags)
    else:
        fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        try:
            *dirs, last = relative.split("/")
            for part in dirs:
                sub = os.open(part, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW, dir_fd=fd)
                os.close(fd)
                fd = sub
            parent, fd = fd, os.open(last, flags | os.O_NOFOLLOW, dir_fd=fd)
            os.close(parent)
        except OSError:
            os.close(fd)
            raise
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise OSError(errno.EINVAL, "not a regular file")
    return os.fdopen(fd, "rb", buffering=0)

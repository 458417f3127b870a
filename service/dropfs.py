"""Reading a drop written by a container, trusting none of it.

Files are opened with :func:`service.beneath.open_beneath` (no symlink followed,
the inode checked through ``O_PATH`` before it is opened for reading); only regular
files with a single link and a size within the limit pass the check. A planted
FIFO, device node or hard link to a file outside the drop is therefore never
opened at all. Errors are :class:`DropError` naming the file and the reason in
plain words.
"""

from __future__ import annotations

import contextlib
import errno
import os
import stat
from collections.abc import Callable
from pathlib import Path

from service.beneath import DIR_FLAGS, open_beneath
from service.config import Limits
from service.errors import DropError, ServiceError
from stager.schema.failures import StagerError
from stager.schema.manifest import MAX_MANIFEST_BYTES, Manifest
from stager.schema.paths import MANIFEST_NAME, parse_drop_name


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
        return os.open(path, DIR_FLAGS)
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


def read_manifest(drop: Path, limits: Limits) -> Manifest:
    """The drop's manifest as intake reads it: beneath the drop's directory (no symbolic
    link followed), at most the schema's or ``limits``' byte bound, whichever is smaller;
    raises what :func:`open_dir`, :func:`read_small` and :meth:`Manifest.from_toml` raise."""
    limit = min(MAX_MANIFEST_BYTES, limits.max_manifest_bytes)
    fd = open_dir(drop)
    try:
        raw = read_small(fd, MANIFEST_NAME, display=drop, max_bytes=limit)
    finally:
        os.close(fd)
    return Manifest.from_toml(raw, source=str(drop / MANIFEST_NAME))


def manifest_kernel(drop: Path, limits: Limits) -> str | None:
    """The kernel ``drop``'s manifest names (:func:`read_manifest`); None when the manifest
    cannot be read or parsed, or names another bundle than the drop's name (intake refuses
    such a drop)."""
    try:
        manifest = read_manifest(drop, limits)
    except (OSError, ServiceError, StagerError, ValueError):
        return None
    named = parse_drop_name(drop.name)
    return manifest.kernel if named is not None and named[0] == manifest.bundle else None


MAX_OPEN_DEPTH = 32  # directories held open at once while removing; deeper ones are hoisted
Tick = Callable[[], None]


class RemoveError(OSError):
    """A tree could not be removed completely; the message names the path and why."""


def remove_tree(parent: Path, name: str, *, max_entries: int, tick: Tick | None = None) -> int:
    """Remove ``parent/name`` and everything below it; return the entries removed.

    Iterative (no recursion on the stack), relative to directory descriptors, never
    following a symbolic link: each subdirectory is opened with ``O_NOFOLLOW`` from
    its parent's descriptor. At most :data:`MAX_OPEN_DEPTH` directories are open at
    once: a deeper one is renamed up into the top directory and removed from there.
    More than ``max_entries`` entries (an absurd tree, or a container refilling it
    while it is removed) raise :class:`RemoveError`, as does anything that cannot be
    removed (a mount point). ``tick`` is called every 256 entries (the watchdog).
    """
    display = parent / name
    try:
        pfd = os.open(parent, DIR_FLAGS)
    except OSError as exc:
        raise RemoveError(exc.errno, f"{parent}: {_why(exc)}") from exc
    try:
        if not _unlink(pfd, name):
            return 0
        removed = _empty_dir(pfd, name, display, max_entries, tick)
        try:
            os.rmdir(name, dir_fd=pfd)
        except FileNotFoundError:
            pass
        except OSError as exc:
            raise RemoveError(exc.errno, f"{display}: {_why(exc)}") from exc
        return removed + 1
    finally:
        os.close(pfd)


def _unlink(fd: int, name: str) -> bool:
    """Unlink ``name`` of ``fd`` unless it is a directory; whether one is left to empty."""
    try:
        os.unlink(name, dir_fd=fd)
    except FileNotFoundError:
        return False
    except IsADirectoryError:
        return True
    except PermissionError:  # EPERM: what unlink(2) says of a directory on Linux
        return stat.S_ISDIR(os.stat(name, dir_fd=fd, follow_symlinks=False).st_mode)
    return False


def _empty_dir(pfd: int, name: str, display: Path, max_entries: int, tick: Tick | None) -> int:
    """Remove everything below the directory ``name`` of ``pfd`` (see :func:`remove_tree`)."""
    stack: list[tuple[int, str]] = []
    removed = hoisted = 0
    try:
        stack.append((os.open(name, DIR_FLAGS, dir_fd=pfd), name))
        top = stack[0][0]
        while stack:
            fd = stack[-1][0]
            count, sub = _files_then_subdir(fd)
            removed += count
            if removed > max_entries:
                raise RemoveError(errno.EFBIG, f"{display}: more than {max_entries} entries")
            if tick is not None and count:
                tick()
            if sub is None and count:  # a batch went: look again
                continue
            if sub is None:  # empty now: close it, and remove it from its parent
                _fd, own = stack.pop()
                os.close(_fd)
                if stack:
                    with contextlib.suppress(FileNotFoundError):
                        os.rmdir(own, dir_fd=stack[-1][0])
                    removed += 1
            elif len(stack) >= MAX_OPEN_DEPTH:
                hoisted += 1
                os.rename(sub, f".rm-{hoisted}", src_dir_fd=fd, dst_dir_fd=top)
            else:
                with contextlib.suppress(FileNotFoundError, NotADirectoryError):
                    stack.append((os.open(sub, DIR_FLAGS, dir_fd=fd), sub))
    except RemoveError:
        raise
    except OSError as exc:
        raise RemoveError(exc.errno, f"{display}: {_why(exc)}") from exc
    finally:
        for fd, _name in stack:
            os.close(fd)
    return removed


def _files_then_subdir(fd: int) -> tuple[int, str | None]:
    """Unlink non-directories of ``fd`` up to its first subdirectory; (how many, that one).

    ``(0, None)`` means the directory is empty.
    """
    count = 0
    with os.scandir(fd) as entries:
        for entry in entries:
            if _unlink(fd, entry.name):
                return count, entry.name
            count += 1
            if count >= 4096:
                break
    return count, None


def tree_size(parent: Path, name: str, *, max_entries: int) -> int | None:
    """Bytes allocated below ``parent/name``, never following a link; None if unmeasurable.

    Unmeasurable: deeper than :data:`MAX_OPEN_DEPTH`, more than ``max_entries``
    entries, or unreadable. Iterative, relative to directory descriptors.
    """
    try:
        st = os.stat(parent / name, follow_symlinks=False)
    except OSError:
        return None
    if not stat.S_ISDIR(st.st_mode):
        return st.st_blocks * 512
    total, seen = 0, 0
    stack: list[int] = []
    try:
        stack.append(os.open(parent / name, DIR_FLAGS))
        pending = [_names(stack[0], max_entries)]
        while stack:
            if not pending[-1]:
                os.close(stack.pop())
                pending.pop()
                continue
            entry = pending[-1].pop()
            seen += 1
            if seen > max_entries:
                return None
            st = os.stat(entry, dir_fd=stack[-1], follow_symlinks=False)
            total += st.st_blocks * 512
            if stat.S_ISDIR(st.st_mode):
                if len(stack) >= MAX_OPEN_DEPTH:
                    return None
                stack.append(os.open(entry, DIR_FLAGS, dir_fd=stack[-1]))
                pending.append(_names(stack[-1], max_entries))
    except OSError:
        return None
    finally:
        for fd in stack:
            os.close(fd)
    return total


def copy_tree(
    parent: Path, name: str, into: Path, *, max_entries: int, max_bytes: int
) -> int | None:
    """Copy directory ``parent/name`` to a new ``into`` (mode 0700), following no link.

    Only directories and regular files are copied (each file opened as
    :func:`open_beneath` opens drop files, so no FIFO or device is ever opened); anything
    else is left out. Returns the bytes copied, or None once a bound is passed (depth
    :data:`MAX_OPEN_DEPTH`, ``max_entries`` entries, ``max_bytes`` bytes) or anything
    fails; a partial copy stays for the caller to remove. Iterative, fd-relative.
    """
    src: list[int] = []
    dst: list[int] = []
    pending: list[list[str]] = []
    total, seen = 0, 0
    try:
        os.mkdir(into, 0o700)
        src.append(os.open(parent / name, DIR_FLAGS))
        dst.append(os.open(into, DIR_FLAGS))
        pending.append(_names(src[0], max_entries))
        while src:
            if not pending[-1]:
                os.close(src.pop())
                os.close(dst.pop())
                pending.pop()
                continue
            entry = pending[-1].pop()
            seen += 1
            st = os.stat(entry, dir_fd=src[-1], follow_symlinks=False)
            if seen > max_entries or (stat.S_ISDIR(st.st_mode) and len(src) >= MAX_OPEN_DEPTH):
                return None
            if stat.S_ISDIR(st.st_mode):
                os.mkdir(entry, 0o700, dir_fd=dst[-1])
                src.append(os.open(entry, DIR_FLAGS, dir_fd=src[-1]))
                dst.append(os.open(entry, DIR_FLAGS, dir_fd=dst[-1]))
                pending.append(_names(src[-1], max_entries))
            elif stat.S_ISREG(st.st_mode) and st.st_nlink == 1:
                # a file of several links may be another's (a hard link to a file outside
                # the drop): never opened, as intake refuses it
                total += _copy_file(src[-1], dst[-1], entry, max_bytes - total)
    except OSError:
        return None
    finally:
        for fd in (*src, *dst):
            os.close(fd)
    return total


def _copy_file(src_dir: int, dst_dir: int, name: str, budget: int) -> int:
    """Copy one regular file by name; raises OSError (EFBIG past ``budget`` bytes)."""

    def regular(st: os.stat_result) -> None:
        if not stat.S_ISREG(st.st_mode):
            raise OSError(errno.EINVAL, "not a regular file")
        if st.st_nlink != 1:  # checked on the O_PATH descriptor, before any read
            raise OSError(errno.EMLINK, f"has {st.st_nlink} hard links")

    fd = open_beneath(src_dir, name, regular)
    try:
        flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
        out = os.open(name, flags, 0o600, dir_fd=dst_dir)
        try:
            copied = 0
            while chunk := os.read(fd, 1 << 20):
                copied += len(chunk)
                if copied > budget:
                    raise OSError(errno.EFBIG, "over the quarantine's byte limit")
                view = memoryview(chunk)
                while view:
                    view = view[os.write(out, view) :]
            return copied
        finally:
            os.close(out)
    finally:
        os.close(fd)


def _names(fd: int, cap: int) -> list[str]:
    """At most ``cap + 1`` entry names of directory ``fd``."""
    out: list[str] = []
    with os.scandir(fd) as entries:
        for entry in entries:
            out.append(entry.name)
            if len(out) > cap:
                break
    return out

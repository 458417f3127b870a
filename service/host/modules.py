"""The kernel's module interface behind one small protocol, with errnos made into words.

:class:`LinuxKernel` calls ``finit_module`` and ``delete_module`` through ctypes
(glibc has no wrappers), reads ``/sys/module`` for what is loaded and runs
``modprobe`` for in-tree dependencies. Tests on a temporary root use a
recording fake; the VM tests use the real thing.

Compressed modules are never handed to the kernel compressed: Debian's 6.1 has no
``CONFIG_MODULE_DECOMPRESS`` (``EOPNOTSUPP``), and none decompresses zstd. The loader
decompresses in userspace, as kmod does (the signature covers the decompressed bytes),
verifies those bytes and passes them to :meth:`LinuxKernel.load_image`, which loads them
from a sealed memfd with flags 0.
"""

from __future__ import annotations

import ctypes
import errno
import fcntl
import os
from pathlib import Path
from typing import Protocol

from service.errors import LoadError
from service.host.sysfs import Sysfs

MODULE_INIT_COMPRESSED_FILE = 4  # include/uapi/linux/module.h (5.17 on)
_SYSCALLS = {"x86_64": (313, 176), "aarch64": (273, 106)}  # finit_module, delete_module

# What finit_module's errnos mean for a module (kernel/module/main.c, signing.c). A module's
# init may return any errno, and finit_module passes it on; do_init_module turns an init's
# EEXIST into EBUSY from 7.1 on ("module: Override -EEXIST module return", 743f8cae549a, a
# stable candidate too), so that EEXIST names only a module already loaded. modstage does not
# predict init results: these texts name both causes where the release decides which.
MEANINGS = {
    errno.EKEYREJECTED: "the kernel rejected the module's signature",
    errno.EBADMSG: "the kernel found the module's signature malformed",
    errno.ENOKEY: "the kernel does not trust the signing key",
    errno.EPERM: "loading modules is not permitted (lockdown, modules_disabled or blacklist)",
    errno.ENOEXEC: "the kernel refused the module's ELF or vermagic",
    errno.ENOENT: "the module needs a symbol no loaded module exports (a dependency is missing)",
    errno.EINVAL: "invalid module or parameter (or a symbol version mismatch)",
    errno.EEXIST: "a module of that name is already loaded (or, before 7.1, its init "
    "returned EEXIST)",
    errno.EBUSY: "a module of that name is being unloaded (or, from 7.1, its init returned "
    "EEXIST or EBUSY)",
    errno.ETXTBSY: "the module file is open for writing",
    errno.ENODEV: "the module's init found no device (init returned -ENODEV)",
    errno.EOPNOTSUPP: "the kernel cannot decompress modules itself",
    errno.ENOSYS: "the kernel has no module support",
}


def describe(code: int) -> str:
    """``NAME: meaning`` for a finit_module errno."""
    name = errno.errorcode.get(code, f"errno {code}")
    return f"{name}: {MEANINGS.get(code, os.strerror(code))}"


class Kernel(Protocol):
    """What the loader needs from the kernel."""

    def load(self, fd: int, params: str) -> None:
        """finit_module the open module file; raise :class:`LoadError` with the errno."""

    def load_image(self, image: bytes, name: str, params: str) -> None:
        """finit_module an in-memory (already decompressed, verified) module image."""

    def load_compressed(self, fd: int, image: bytes, params: str) -> None:
        """finit_module the compressed file ``fd`` with ``MODULE_INIT_COMPRESSED_FILE``: the
        kernel decompresses it (to ``image``, which modstage verified) and loads that."""

    def unload(self, name: str) -> None:
        """delete_module ``name`` (non-blocking)."""

    def loaded(self) -> dict[str, str | None]:
        """Live modules: name -> srcversion (None when the module has none)."""

    def modprobe(self, names: list[str]) -> None:
        """Load in-tree modules (with their dependencies) by name."""


class LinuxKernel:
    """The running kernel."""

    def __init__(self, sys: Path) -> None:
        self.sys = sys
        self.sysfs = Sysfs(sys)
        self._libc = ctypes.CDLL(None, use_errno=True)
        self._finit, self._delete = _SYSCALLS[os.uname().machine]

    def load(self, fd: int, params: str, flags: int = 0) -> None:
        """finit_module(fd, params, flags)."""
        if self._libc.syscall(self._finit, fd, params.encode(), flags) != 0:
            code = ctypes.get_errno()
            raise LoadError(code, describe(code))

    def load_compressed(self, fd: int, image: bytes, params: str) -> None:
        """finit_module(fd, params, MODULE_INIT_COMPRESSED_FILE)."""
        self.load(fd, params, MODULE_INIT_COMPRESSED_FILE)

    def load_image(self, image: bytes, name: str, params: str) -> None:
        """finit_module ``image`` from a sealed, read-only memfd named ``name``, flags 0."""
        fd = sealed_memfd(image, name)
        try:
            self.load(fd, params)
        finally:
            os.close(fd)

    def unload(self, name: str) -> None:
        """delete_module(name, O_NONBLOCK)."""
        if self._libc.syscall(self._delete, name.encode(), os.O_NONBLOCK) != 0:
            code = ctypes.get_errno()
            raise LoadError(code, f"cannot unload {name}: {os.strerror(code)}")

    def loaded(self) -> dict[str, str | None]:
        """Modules under /sys/module that have an initstate (built-ins have none)."""
        return live_modules(self.sysfs)

    def modprobe(self, names: list[str]) -> None:
        """``modprobe -a NAMES``; a failure is a :class:`LoadError` with modprobe's words."""
        if not names:
            return
        import subprocess  # a boot whose modules need no in-tree module never runs it

        done = subprocess.run(
            ["modprobe", "-a", *names], capture_output=True, text=True, check=False
        )
        if done.returncode != 0:
            raise LoadError(
                errno.ENOENT,
                f"modprobe {' '.join(names)} failed: {done.stderr.strip() or done.returncode}",
            )


def live_modules(sysfs: Sysfs) -> dict[str, str | None]:
    """``module/*`` entries with an ``initstate`` (built-ins have none): name -> srcversion.

    ``srcversion`` is None where the kernel made no such file (the module's ``.modinfo``
    has none).
    """
    live: dict[str, str | None] = {}
    for name in sysfs.entries("module"):
        if sysfs.has(f"module/{name}/initstate"):
            src = f"module/{name}/srcversion"
            live[name] = sysfs.read(src).strip() if sysfs.has(src) else None
    return live


def own_fd(fd: int) -> str:
    """``/proc/self/fd/N``: this process's own descriptor table, the same under any root.

    Not a fact about the host, so not a :class:`~service.layout.Layout` path: a sandbox
    root has no ``proc/self`` of its own.
    """
    return f"/proc/self/fd/{fd}"


def sealed_memfd(image: bytes, name: str) -> int:
    """A read-only descriptor of a memfd holding ``image``, sealed against any change.

    The writable descriptor is closed before returning: finit_module refuses a file that
    is open for writing anywhere (``deny_write_access``: ETXTBSY).
    """
    fd = os.memfd_create(name, os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING)
    try:
        view = memoryview(image)
        while view:
            view = view[os.write(fd, view) :]
        seals = fcntl.F_SEAL_SHRINK | fcntl.F_SEAL_GROW | fcntl.F_SEAL_WRITE | fcntl.F_SEAL_SEAL
        fcntl.fcntl(fd, fcntl.F_ADD_SEALS, seals)
        # reopen read-only through this process's own descriptor table
        return os.open(own_fd(fd), os.O_RDONLY | os.O_CLOEXEC)
    finally:
        os.close(fd)

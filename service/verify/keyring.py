"""Does the running kernel enforce module signatures, and does it trust a given key?

The kernel checks module signatures against ``.secondary_trusted_keys`` (which
links the builtin keys and, where configured, the machine/MOK keys). When it
enforces signatures, intake asks it, through ``keyctl(KEYCTL_SEARCH)``, whether
each signer's key id is there: a generation the kernel is bound to refuse must
never cost a reboot.
"""

from __future__ import annotations

import ctypes
import errno
import os
from pathlib import Path
from typing import Protocol

from service.layout import Layout

_SYS_KEYCTL = {"x86_64": 250, "aarch64": 219}
_KEYCTL_SEARCH = 10
_KEYRINGS = (".secondary_trusted_keys", ".builtin_trusted_keys")


def enforcing(layout: Layout) -> str | None:
    """Why the running kernel refuses unsigned or untrusted modules, or None if it does not."""
    sig_enforce = layout.sys / "module/module/parameters/sig_enforce"
    try:
        if sig_enforce.read_text().strip() == "Y":
            return "module.sig_enforce=1"
    except OSError:
        pass
    try:
        lockdown = (layout.sys / "kernel/security/lockdown").read_text()
    except OSError:
        return None
    for mode in ("integrity", "confidentiality"):
        if f"[{mode}]" in lockdown:
            return f"lockdown={mode}"
    return None


class Keyring(Protocol):
    """The kernel's trusted keys, asked by key id (hex)."""

    def trusts(self, key_id: str) -> bool:
        """Whether a key with this exact id is one the kernel verifies modules against."""


class KernelKeyring:
    """The running kernel's system keyrings, through /proc/keys and keyctl(2)."""

    def __init__(self, proc: Path) -> None:
        self.proc = proc
        self._libc = ctypes.CDLL(None, use_errno=True)

    def _keyring_ids(self) -> list[int]:
        ids = []
        for line in (self.proc / "keys").read_text().splitlines():
            fields = line.split()
            if len(fields) >= 9 and fields[7] == "keyring" and fields[8].rstrip(":") in _KEYRINGS:
                ids.append(int(fields[0], 16))
        return ids

    def trusts(self, key_id: str) -> bool:
        """Search the system keyrings for ``asymmetric`` key ``ex:<key_id>``."""
        nr = _SYS_KEYCTL[os.uname().machine]
        for ring in self._keyring_ids():
            found = self._libc.syscall(
                nr, _KEYCTL_SEARCH, ring, b"asymmetric", f"ex:{key_id}".encode(), 0
            )
            err = ctypes.get_errno()
            # The system keys grant root VIEW|READ but not SEARCH; the kernel matches a key
            # before it checks SEARCH, so EACCES means "a key with this id is there" and
            # ENOKEY "no such key" (security/keys/keyring.c, keyring_search_iterator).
            if found >= 0 or err == errno.EACCES:
                return True
            if err != errno.ENOKEY:
                raise OSError(err, os.strerror(err), "keyctl(KEYCTL_SEARCH)")
        return False

"""Whether the kernel loaded a module without a trusted signature: its taint flags.

When the signature of a module is missing, cannot be checked or names a key no trusted
keyring holds, and the kernel does not enforce signatures, it loads the module anyway and
taints itself (kernel/module/main.c: "module verification failed: signature and/or required
key missing - tainting kernel"): bit 13, ``TAINT_UNSIGNED_MODULE``, of the mask in
``/proc/sys/kernel/tainted`` (decimal; include/linux/panic.h), and the letter ``E`` in the
module's own ``/sys/module/<name>/taint`` (``module_flags_taint``: the module flags' letters
of kernel/panic.c's table, e.g. ``OE``). Both files exist only with loadable modules.
"""

from __future__ import annotations

from pathlib import Path

TAINT_UNSIGNED_MODULE = 13
UNSIGNED = "E"


def kernel_taint(path: Path) -> int | None:
    """The kernel's taint mask (``/proc/sys/kernel/tainted``), None when unreadable."""
    try:
        return int(path.read_text().strip())
    except (OSError, ValueError):
        return None


def unsigned_taint(mask: int | None) -> bool | None:
    """Whether the mask has ``TAINT_UNSIGNED_MODULE`` (None: the mask is unknown)."""
    return None if mask is None else bool(mask >> TAINT_UNSIGNED_MODULE & 1)


def module_taint(sys_root: Path, name: str) -> str | None:
    """The taint letters of live module ``name`` (``""``: none), None when it is not live
    or the file cannot be read."""
    try:
        return (sys_root / "module" / name / "taint").read_text().strip()
    except (OSError, UnicodeDecodeError):
        return None

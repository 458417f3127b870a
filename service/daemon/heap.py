"""Give the heap back to the kernel after work that grew it (the daemon idles small).

Taking in a bundle reads hundreds of MiB in 1 MiB buffers on several threads; glibc
keeps what they freed in its arenas, so a daemon that took in one big bundle would
idle several MiB larger for the rest of its life. ``malloc_trim(0)`` returns the free
pages of every arena. Elsewhere than glibc it is a no-op.
"""

from __future__ import annotations

import ctypes


def trim() -> bool:
    """Return free heap pages to the kernel; True if glibc released any."""
    try:
        libc = ctypes.CDLL(None)  # the process's own symbols: libc is among them
        malloc_trim = libc.malloc_trim
    except (OSError, AttributeError):
        return False
    malloc_trim.argtypes = [ctypes.c_size_t]
    malloc_trim.restype = ctypes.c_int
    return bool(malloc_trim(0))

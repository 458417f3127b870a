"""sd_notify: tell systemd we are ready, what we do, and that we are alive."""

from __future__ import annotations

import os
import socket


def notify(*lines: str) -> bool:
    """Send ``lines`` (``READY=1``, ``STATUS=...``, ``WATCHDOG=1``) to ``$NOTIFY_SOCKET``."""
    address = os.environ.get("NOTIFY_SOCKET")
    if not address:
        return False
    if address.startswith("@"):
        address = "\0" + address[1:]
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC) as sock:
        try:  # never block the daemon on a reader that does not keep up
            sock.sendto("\n".join(lines).encode(), socket.MSG_DONTWAIT, address)
        except (BlockingIOError, ConnectionRefusedError, FileNotFoundError):
            return False
    return True


def watchdog_interval() -> float | None:
    """Half of systemd's watchdog timeout in seconds, if one is set for this process."""
    usec = os.environ.get("WATCHDOG_USEC")
    pid = os.environ.get("WATCHDOG_PID")
    if not usec or (pid and int(pid) != os.getpid()):
        return None
    return int(usec) / 2e6

"""The daemon's events: what its watchers put on the loop's one queue.

The drop watch (:mod:`service.daemon.watcher`, watchdog's observer), the kernel watch
(:mod:`service.daemon.kernelwatch`, another observer) and the kernel's uevents
(:mod:`service.daemon.uevents`, pyudev) run their own threads; they only put an
:class:`Event` on the daemon's queue. Nothing that puts one reads or changes modstage's
state: the loop's one thread does.
"""

from __future__ import annotations

import enum
import queue
import time
from dataclasses import dataclass, field

Queue = queue.Queue["Event"]


class Kind(enum.StrEnum):
    """What happened; the value is the name logs and tests use."""

    DROP = "drop"  # something changed in an incoming directory or in a drop
    OVERFLOW = "overflow"  # the kernel dropped drop events: rescan everything
    MEMORY = "memory"  # a memory block was added or went offline
    DEVICES = "devices"  # a PCI device appeared, went, or was bound or unbound
    MODULES = "modules"  # a kernel module was unloaded or loaded (detail: "remove nvidia")
    KERNEL = "kernel"  # a kernel's files or grub's changed: the next kernel read again
    KERNEL_HOOK = "kernel_hook"  # a kernel package's hook ran (its files are in place)
    STOP = "stop"  # SIGTERM, SIGINT, or a test: leave the loop


@dataclass(frozen=True)
class Event:
    """Something happened, at ``at`` on the monotonic clock; ``detail`` says what."""

    kind: Kind
    detail: str = ""
    at: float = field(default_factory=time.monotonic)

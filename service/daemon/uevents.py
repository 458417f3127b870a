"""The daemon's ear for the kernel: memory blocks and PCI devices, through pyudev.

:class:`KernelUevents` is pyudev's ``Monitor.from_netlink(context, source="kernel")``: the
kernel's own uevent multicast group (libudev drops a message any user-space process sends
there), filtered to the ``memory`` and ``pci`` subsystems, with a 16 MiB receive buffer. It
needs no udevd. :class:`UeventListener` reads it on its own thread and decides with pure
functions of each :class:`Uevent` what to do:

* an ``add`` or ``offline`` of a memory block: apply the host's ``hotplug_policy`` to that
  block at once, on this thread (:func:`online_block`: the pure plan of
  :mod:`service.host.memory` over the block's state, one sysfs write), then tell the loop
  (:data:`~service.daemon.events.Kind.MEMORY`), which walks the blocks again and refreshes
  the metrics once the hot-add settles;
* an ``add``, ``remove``, ``bind`` or ``unbind`` of a PCI device: tell the loop
  (:data:`~service.daemon.events.Kind.DEVICES`), which refreshes the metrics (and with them
  the device view of :mod:`service.host.pci`) when a GPU appears, is bound or is lost;
* a ``remove`` or ``add`` of a kernel module (``delete_module``, as the driver pod's init
  container does before an upgrade, or a load): tell the loop
  (:data:`~service.daemon.events.Kind.MODULES`), which records when each module left the
  kernel (:mod:`service.status.unloads`: ``status`` tells an upgrade from a failure by it);
* a lost message (the receive buffer overflowed, ``ENOBUFS``): an event without a block,
  on which the loop walks every block and refreshes the device view.

Nothing here touches modstage's state. The source is a small protocol (:class:`Source`), so
the listener's decisions and its thread are tested with a fake one; the pyudev source is
proved on the real kernels in the test VM.
"""

from __future__ import annotations

import errno
import os
import select
import threading
import time
from dataclasses import dataclass
from typing import Any, Protocol

import pyudev

from service.daemon.events import Event, Kind, Queue
from service.host.memory import (
    MEMORY,
    Onlined,
    block_number,
    hand_over,
    move_misplaced,
    plan_onlining,
)
from service.host.onlining_log import log_onlining
from service.host.sysfs import Sysfs
from service.logs import get_logger
from stager.schema.manifest import MemoryPolicy

log = get_logger("modstage.memory")
RCVBUF = 16 << 20  # a large hot-add announces hundreds of blocks at once
SUBSYSTEMS = ("memory", "pci", "module")
MEMORY_ACTIONS = ("add", "offline")  # online events are our own writes: nothing to do
PCI_ACTIONS = ("add", "remove", "bind", "unbind")  # a device appears, is lost, bound, unbound
MODULE_ACTIONS = ("add", "remove")  # a module is loaded, unloaded


@dataclass(frozen=True)
class Uevent:
    """What the listener needs of one kernel uevent: ``add`` of ``memory`` ``memory32``."""

    action: str
    subsystem: str
    sys_name: str  # the device's directory name: memory32, 0000:41:00.0

    @classmethod
    def of(cls, device: Any) -> Uevent:
        """The uevent a ``pyudev.Device`` received from a monitor describes."""
        return cls(str(device.action), str(device.subsystem), str(device.sys_name))

    @property
    def memory_block(self) -> int | None:
        """The memory block an ``add`` or ``offline`` names; None for any other uevent."""
        if self.subsystem != "memory" or self.action not in MEMORY_ACTIONS:
            return None
        return block_number(self.sys_name)

    @property
    def device_change(self) -> bool:
        """Whether this is a PCI device appearing, going, or gaining or losing its driver."""
        return self.subsystem == "pci" and self.action in PCI_ACTIONS

    @property
    def module_change(self) -> bool:
        """Whether this is a kernel module loaded or unloaded (``sys_name``: its name)."""
        return self.subsystem == "module" and self.action in MODULE_ACTIONS

    def event(self, at: float) -> Event | None:
        """What the loop is told of this uevent (None: nothing it acts on)."""
        block = self.memory_block
        if block is not None:
            return Event(Kind.MEMORY, f"{self.action} memory{block}", at=at)
        if self.device_change:
            return Event(Kind.DEVICES, f"{self.action} {self.sys_name}", at=at)
        if self.module_change:
            return Event(Kind.MODULES, f"{self.action} {self.sys_name}", at=at)
        return None


class Overflow(Exception):
    """The source lost messages: its receive buffer overflowed (``ENOBUFS``)."""


class Source(Protocol):
    """Where uevents come from: a descriptor to wait on, and the next uevent queued."""

    def fileno(self) -> int:
        """Readable when a uevent is queued."""
        ...

    def receive(self) -> Uevent | None:
        """The next queued uevent, None when none is; :class:`Overflow` when some were lost."""
        ...

    def close(self) -> None:
        """Stop receiving."""
        ...


def size_receive_buffer(monitor: Any, wanted: int = RCVBUF) -> int:
    """Give ``monitor``'s netlink socket a receive buffer of ``wanted`` bytes, or as much of it
    as this process may; the size it got (as the kernel counts it: twice what was set).

    libudev sets it with ``SO_RCVBUFFORCE``, which needs ``CAP_NET_ADMIN`` (the daemon's unit
    does not grant it); without it, plain ``SO_RCVBUF``, which the kernel caps at
    ``net.core.rmem_max`` (``net/core/sock.c``, ``sk_setsockopt``). A buffer that still
    overflows loses events the daemon notices (ENOBUFS: a full rescan), so a capped buffer is
    logged as information, and only a socket that takes no size at all as a warning.
    """
    import socket

    try:
        monitor.set_receive_buffer_size(wanted)
        how = "SO_RCVBUFFORCE"
    except OSError as exc:
        if exc.errno not in (errno.EPERM, errno.EACCES):
            log.warning("uevents.buffer_unset", wanted=wanted, error=str(exc))
            return 0
        how = "SO_RCVBUF (capped at net.core.rmem_max)"
        try:
            with socket.fromfd(monitor.fileno(), socket.AF_NETLINK, socket.SOCK_RAW) as sock:
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, wanted)
        except OSError as again:
            log.warning("uevents.buffer_unset", wanted=wanted, error=str(again))
            return 0
    with socket.fromfd(monitor.fileno(), socket.AF_NETLINK, socket.SOCK_RAW) as sock:
        got = sock.getsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF)
    log.info("uevents.buffer", bytes=got, wanted=wanted, set_with=how)
    return int(got)


class KernelUevents:
    """pyudev's monitor of the kernel's uevents for :data:`SUBSYSTEMS`, receiving from the
    moment it is made (so a block added before anyone enumerates is not missed)."""

    def __init__(self, context: pyudev.Context | None = None) -> None:
        context = context if context is not None else pyudev.Context()
        self.monitor: Any = pyudev.Monitor.from_netlink(context, source="kernel")
        for subsystem in SUBSYSTEMS:
            self.monitor.filter_by(subsystem)
        size_receive_buffer(self.monitor)
        self.monitor.start()

    def fileno(self) -> int:
        """The monitor's netlink socket."""
        return int(self.monitor.fileno())

    def receive(self) -> Uevent | None:
        """The next queued uevent of the kernel (never blocks)."""
        try:
            device = self.monitor.poll(timeout=0)
        except OSError as exc:
            if exc.errno == errno.ENOBUFS:
                raise Overflow from exc
            raise
        return None if device is None else Uevent.of(device)

    def close(self) -> None:
        """Let the monitor go: libudev closes its socket with its last reference."""
        self.monitor = None


def online_block(sysfs: Sysfs, block: int, policy: MemoryPolicy, *, since: float) -> list[Onlined]:
    """Apply ``policy`` to one block as :func:`~service.host.memory.online_blocks` would
    (the same plan, the same steps), with two bare system calls and no buffered file
    objects: under emulation every layer of Python I/O shows in the block's latency."""
    path = f"{sysfs.root}/{MEMORY}/memory{block}/state"  # no pathlib objects per block
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
        try:
            state = os.read(fd, 64).decode("ascii", "replace").strip()
        finally:
            os.close(fd)
    except OSError:  # gone again
        return []
    steps = plan_onlining({block: state}, policy)  # one block: no step or one
    if not steps:
        return []
    value = steps[0].state
    try:
        fd = os.open(path, os.O_WRONLY | os.O_TRUNC | os.O_CLOEXEC)
        try:
            os.write(fd, value.encode())  # one write(2), as sysfs wants
        finally:
            os.close(fd)
    except OSError as exc:
        return [Onlined(block, value, error=str(exc))]
    return [Onlined(block, value, latency_ms=round((time.monotonic() - since) * 1000, 3))]


class UeventListener:
    """Listens to the kernel's uevents on its own thread: onlines memory blocks as they
    come and tells the loop of blocks and devices. ``source`` is injectable for tests."""

    source_name = "kernel"

    def __init__(
        self, sysfs: Sysfs, policy: str, events: Queue, *, source: Source | None = None
    ) -> None:
        self.sysfs = sysfs
        self.policy = None if policy == "kernel" else MemoryPolicy(policy)
        self.events = events
        self.source: Source = source if source is not None else KernelUevents()
        self._wake_r, self._wake_w = os.pipe2(os.O_CLOEXEC)
        self.thread = threading.Thread(target=self._run, name="uevents", daemon=True)

    def start(self) -> None:
        """Take the blocks over from the kernel, then start listening.

        With a policy, a kernel that onlines hot-added memory itself is told not to
        (:func:`~service.host.memory.hand_over`), and blocks it onlined into another
        zone before are moved, here on the caller's thread (which bounds each offlining
        in time) and before the thread listens, so a move's own ``offline`` uevent is
        not taken for a new block.
        """
        if self.policy is not None:
            if hand_over(self.sysfs):
                log.info("memory.handed_over", auto_online_blocks="offline")
            log_onlining(move_misplaced(self.sysfs, self.policy))
        self.thread.start()

    def stop(self) -> None:
        """Stop the thread and close the source."""
        os.write(self._wake_w, b"x")
        self.thread.join(timeout=5)
        self.source.close()
        os.close(self._wake_r)
        os.close(self._wake_w)

    def _run(self) -> None:
        poller = select.poll()
        poller.register(self.source.fileno(), select.POLLIN)
        poller.register(self._wake_r, select.POLLIN)
        while True:
            if any(fd == self._wake_r for fd, _ in poller.poll()):
                return
            try:
                self._drain()
            except Exception as exc:  # the loop still hears of every block and retries it
                log.error("memory.uevents_failed", error=str(exc))

    def _drain(self) -> None:
        """Handle every uevent queued now: online each added block as it is read, tell the
        loop after the burst, log last (logging delays no block)."""
        seen: list[Event] = []
        done: list[Onlined] = []
        while True:
            try:
                uevent = self.source.receive()
            except Overflow:
                at = time.monotonic()
                seen.append(Event(Kind.MEMORY, "overflow: walk every block", at=at))
                seen.append(Event(Kind.DEVICES, "overflow: read the devices again", at=at))
                continue
            if uevent is None:
                break
            at = time.monotonic()
            event = uevent.event(at)
            if event is None:
                continue
            block = uevent.memory_block
            if block is not None and self.policy is not None:
                done += online_block(self.sysfs, block, self.policy, since=at)
            seen.append(event)
        for event in seen:
            self.events.put(event)
        log_onlining(done)

"""Online hot-added memory the moment the kernel announces it, on the listener's own thread.

Measured in the test VM (``bench/hotplug``): with a pyudev observer handing each ``add``
to the loop, the daemon onlined a DIMM several times slower than a udev rule, and
not at all while the loop was busy taking a drop in. This listener reads the kernel's
uevents from a netlink socket itself (``NETLINK_KOBJECT_UEVENT``, the kernel's
multicast group, messages from a user-space sender ignored as libudev ignores them)
and, for an ``add`` or ``offline`` of a memory block, applies the host's
``hotplug_policy`` to that block at once (:func:`online_block`: the pure plan of
:mod:`service.kernel.memory` over the block's state, one sysfs write). It touches no modstage state:
the loop still gets one :class:`~service.daemon.events.Event` per block, after the
write (this thread logs what it did); the loop's own pass over the block finds
nothing left to do unless the write failed, and it refreshes the metrics as before.
A lost message (the socket's buffer overflowed) becomes an event without a block: the
loop walks every block.
"""

from __future__ import annotations

import contextlib
import errno
import os
import select
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from service.daemon.events import Event, Kind, Queue
from service.kernel.memory import (
    MEMORY,
    Onlined,
    block_number,
    hand_over,
    move_misplaced,
    plan_onlining,
)
from service.kernel.onlining_log import log_onlining
from service.kernel.sysfs import Sysfs
from service.logs import get_logger
from stager.manifest import MemoryPolicy

log = get_logger("modstage.memory")
NETLINK_KOBJECT_UEVENT = 15
KERNEL_GROUP = 1  # the kernel's own uevents (udevd re-sends on group 2 after its rules)
RCVBUF = 16 << 20  # a large hot-add announces hundreds of blocks at once
ACTIONS = ("add", "offline")  # online events are our own writes: nothing to do
PREFIX = f"/{MEMORY}/memory"


@dataclass(frozen=True)
class Uevent:
    """The head of one kernel uevent: ``add@/devices/system/memory/memory32``."""

    action: str
    devpath: str

    @classmethod
    def parse(cls, message: bytes) -> Uevent | None:
        """The head of a kernel uevent message; None for anything else (libudev's format)."""
        head = message.split(b"\0", 1)[0]
        action, at, devpath = head.partition(b"@")
        if not at or not devpath.startswith(b"/"):
            return None
        try:
            return cls(action.decode("ascii"), devpath.decode("ascii"))
        except UnicodeDecodeError:
            return None

    @property
    def memory_block(self) -> int | None:
        """The memory block an ``add`` or ``offline`` names; None for any other uevent."""
        if self.action not in ACTIONS or not self.devpath.startswith(PREFIX):
            return None
        return block_number(self.devpath.rsplit("/", 1)[1])


def kernel_socket() -> socket.socket:
    """A netlink socket bound to the kernel's uevent group, with a large receive buffer."""
    sock = socket.socket(socket.AF_NETLINK, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC, 15)
    for option in (getattr(socket, "SO_RCVBUFFORCE", 33), socket.SO_RCVBUF):
        with contextlib.suppress(OSError):  # FORCE needs CAP_NET_ADMIN; else what rmem_max allows
            sock.setsockopt(socket.SOL_SOCKET, option, RCVBUF)
            break
    sock.bind((0, KERNEL_GROUP))
    return sock


def from_kernel(address: object) -> bool:
    """Whether a netlink sender address is the kernel's (port id 0)."""
    return isinstance(address, tuple) and len(address) >= 1 and address[0] == 0


def online_block(sysfs: Sysfs, block: int, policy: MemoryPolicy, *, since: float) -> list[Onlined]:
    """Apply ``policy`` to one block as :func:`~service.kernel.memory.online_blocks` would
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


class MemoryOnliner:
    """Listens to kernel uevents on its own thread and onlines memory blocks as they come.

    ``sock`` and ``trusted`` are injectable for tests (a datagram socket pair, any sender).
    """

    source = "kernel"

    def __init__(
        self,
        sysfs: Sysfs,
        policy: str,
        events: Queue,
        *,
        sock: socket.socket | None = None,
        trusted: Callable[[object], bool] = from_kernel,
    ) -> None:
        self.sysfs = sysfs
        self.policy = None if policy == "kernel" else MemoryPolicy(policy)
        self.events = events
        self.sock = sock if sock is not None else kernel_socket()
        self.trusted = trusted
        self._wake_r, self._wake_w = os.pipe2(os.O_CLOEXEC)
        self.thread = threading.Thread(target=self._run, name="memory-uevents", daemon=True)

    def start(self) -> None:
        """Take the blocks over from the kernel, then start listening (before anyone
        enumerates blocks: none is missed).

        With a policy, a kernel that onlines hot-added memory itself is told not to
        (:func:`~service.kernel.memory.hand_over`), and blocks it onlined into another
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
        """Stop the thread and close the socket."""
        os.write(self._wake_w, b"x")
        self.thread.join(timeout=5)
        self.sock.close()
        os.close(self._wake_r)
        os.close(self._wake_w)

    def _run(self) -> None:
        poller = select.poll()
        poller.register(self.sock, select.POLLIN)
        poller.register(self._wake_r, select.POLLIN)
        while True:
            if any(fd == self._wake_r for fd, _ in poller.poll()):
                return
            try:
                self._drain()
            except Exception as exc:  # the loop still hears of every block and retries it
                log.error("memory.uevents_failed", error=str(exc))

    def _drain(self) -> None:
        """Handle every message queued now: online each block first, tell the loop after."""
        seen: list[Event] = []
        done: list[Onlined] = []
        while True:
            try:
                message, address = self.sock.recvfrom(1 << 16, socket.MSG_DONTWAIT)
            except BlockingIOError:
                break
            except OSError as exc:
                if exc.errno != errno.ENOBUFS:
                    log.error("memory.uevents_failed", error=str(exc))
                    break
                seen.append(Event(Kind.MEMORY, "overflow: walk every block"))
                continue
            if not self.trusted(address):
                continue
            uevent = Uevent.parse(message)
            block = uevent.memory_block if uevent is not None else None
            if uevent is None or block is None:
                continue
            at = time.monotonic()
            if self.policy is not None:
                done += online_block(self.sysfs, block, self.policy, since=at)
            seen.append(Event(Kind.MEMORY, f"{uevent.action} memory{block}", at=at))
        for event in seen:
            self.events.put(event)
        log_onlining(done)  # after every write of this burst: logging delays no block

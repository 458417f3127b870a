"""Memory hotplug onlining: pure plans over block states, applied through sysfs.

``auto_online_blocks`` decides what the kernel does with blocks added later;
blocks already present and offline are onlined by modstage as the policy says, and
hot-pluggable blocks the kernel onlined into another zone before the policy was set
(Debian 13's 6.12 onlines by itself) are moved (docs/boot-path.md).
Order: since Linux 4.13 zones may overlap, and 6.1 puts a block written
``online_movable`` into ZONE_MOVABLE whatever its neighbours (``zone_for_pfn_range``
with MMOP_ONLINE_MOVABLE), so the order no longer decides the zone. Blocks are still
onlined highest first for ``online_movable``, which is harmless and keeps the movable
range contiguous at the top on older kernels.
"""

from __future__ import annotations

import contextlib
import re
import signal
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass

from service.host.sysfs import Sysfs
from stager.schema.manifest import MemoryPolicy

MEMORY = "devices/system/memory"
_BLOCK = re.compile(r"memory(\d+)\Z")
_NODE = re.compile(r"node(\d+)\Z")

# Misplaced blocks: online, but not in the zone the policy puts hot-added memory in.
OFFLINE_TIMEOUT = 10.0  # seconds one block's offlining may take before it is given up
ZONE = {MemoryPolicy.ONLINE_MOVABLE: "Movable"}  # the zone a policy puts a block in
NOT_ZONE = {MemoryPolicy.ONLINE_KERNEL: "Movable"}  # ... or the zone it keeps a block out of
FIRMWARE_NODE = "firmware_node"  # a block's link to the ACPI memory device (PNP0C80) holding it


@dataclass(frozen=True)
class Onlining:
    """One block to online and how (the value written to its ``state``)."""

    block: int
    state: str


@dataclass(frozen=True)
class Onlined:
    """One step of an onlining pass as done: a block written, or the kernel's setting.

    ``block`` None is the ``auto_online_blocks`` setting written to ``state``; a block
    the kernel refused carries its ``error`` and no latency.
    """

    block: int | None
    state: str
    latency_ms: float | None = None
    error: str | None = None
    moved_from: str | None = None

    def fields(self) -> dict[str, object]:
        """The step as it is logged."""
        if self.block is None:
            return {"auto_online_blocks": self.state}
        moved = {} if self.moved_from is None else {"moved_from": self.moved_from}
        if self.error is not None:
            return {"block": self.block, "state": self.state, **moved, "error": self.error}
        return {"block": self.block, "state": self.state, **moved, "latency_ms": self.latency_ms}


def plan_onlining(blocks: dict[int, str], policy: MemoryPolicy) -> list[Onlining]:
    """Which offline blocks to online for ``policy``, in the order to do it."""
    if policy is MemoryPolicy.OFFLINE:
        return []
    offline = sorted(
        (n for n, s in blocks.items() if s == "offline"),
        reverse=policy is MemoryPolicy.ONLINE_MOVABLE,
    )
    return [Onlining(n, policy.value) for n in offline]


@dataclass(frozen=True)
class Block:
    """One memory block as sysfs shows it: number, state, NUMA node and valid zones."""

    number: int
    state: str
    node: int | None = None
    zones: tuple[str, ...] = ()

    @property
    def zone(self) -> str | None:
        """The zone an online block is in (the first of ``valid_zones``); None otherwise."""
        return self.zones[0] if self.state == "online" and self.zones else None


def walk(sysfs: Sysfs, *, detail: bool = False) -> list[Block]:
    """Every memory block with a readable state, by number; ``detail`` adds node and zones.

    The one walk over ``devices/system/memory``; a block gone during the walk is left out.
    """
    found: list[Block] = []
    for name in sysfs.entries(MEMORY):
        if (n := block_number(name)) is None or (state := _state(sysfs, n)) is None:
            continue
        if detail:
            found.append(Block(n, state, _node(sysfs, name), _zones(sysfs, name)))
        else:
            found.append(Block(n, state))
    return sorted(found, key=lambda b: b.number)


def blocks(sysfs: Sysfs, only: Iterable[int] | None = None) -> dict[int, str]:
    """Every memory block and its state; or just the blocks ``only`` names that exist."""
    if only is not None:
        return {n: s for n in only if (s := _state(sysfs, n)) is not None}
    return {b.number: b.state for b in walk(sysfs)}


def _state(sysfs: Sysfs, block: int) -> str | None:
    try:
        return sysfs.read(f"{MEMORY}/memory{block}/state").strip()
    except OSError:  # gone again, or never there
        return None


def _node(sysfs: Sysfs, name: str) -> int | None:
    """The NUMA node a block's ``nodeN`` link names, if any."""
    found = (_NODE.match(e) for e in sysfs.entries(f"{MEMORY}/{name}"))
    return next((int(m.group(1)) for m in found if m), None)


def _zones(sysfs: Sysfs, name: str) -> tuple[str, ...]:
    try:
        return tuple(sysfs.read(f"{MEMORY}/{name}/valid_zones").split())
    except OSError:
        return ()


def block_number(name: str) -> int | None:
    """``memory42`` -> 42; None for anything else."""
    m = _BLOCK.match(name)
    return int(m.group(1)) if m else None


def online_blocks(
    sysfs: Sysfs,
    policy: MemoryPolicy,
    *,
    since: float | None = None,
    clock: Callable[[], float] = time.monotonic,
    only: Iterable[int] | None = None,
) -> list[Onlined]:
    """Online the offline blocks ``policy`` asks for; each with its latency from ``since``.

    ``only`` limits the pass to the named blocks (those a uevent just announced: no
    walk over every block). A block the kernel refuses to online is reported with its
    error and skipped.
    """
    started = clock() if since is None else since
    done: list[Onlined] = []
    for step in plan_onlining(blocks(sysfs, only), policy):
        try:
            sysfs.write(f"{MEMORY}/memory{step.block}/state", step.state)
        except OSError as exc:
            done.append(Onlined(step.block, step.state, error=str(exc)))
            continue
        ms = round((clock() - started) * 1000, 3)
        done.append(Onlined(step.block, step.state, latency_ms=ms))
    return done


def apply_policy(
    sysfs: Sysfs, policy: MemoryPolicy, *, offline_timeout: float = OFFLINE_TIMEOUT
) -> list[Onlined]:
    """Set ``auto_online_blocks``, online present blocks, move misplaced ones; what was done.

    The setting comes first: from then on the kernel onlines what is added as the policy
    says. Blocks it onlined before (Debian 13's 6.12 onlines hot-added memory into
    ZONE_NORMAL by default, before any uevent) are then moved (:func:`move_misplaced`).
    """
    done: list[Onlined] = []
    if sysfs.write(f"{MEMORY}/auto_online_blocks", policy.value):
        done.append(Onlined(None, policy.value))
    done += online_blocks(sysfs, policy)
    return done + move_misplaced(sysfs, policy, offline_timeout=offline_timeout)


def hot_pluggable(sysfs: Sysfs, block: int) -> bool:
    """Whether the block belongs to a memory device the firmware declares hot-pluggable.

    The kernel links every block of an ACPI memory device (a DIMM slot; ``PNP0C80``) to it
    with ``firmware_node`` (``acpi_bind_memory_blocks``); memory the firmware hands over at
    boot in its memory map has no such link. Only such blocks are ever offlined by
    modstage: the node's boot memory is never touched.
    """
    return sysfs.has(f"{MEMORY}/memory{block}/{FIRMWARE_NODE}")


def misplaced(sysfs: Sysfs, policy: MemoryPolicy) -> list[Block]:
    """Hot-pluggable blocks online in a zone ``policy`` would not have put them in.

    ``online_movable`` wants ZONE_MOVABLE, ``online_kernel`` anything but it; ``online``
    and ``offline`` name no zone, so nothing is misplaced under them.
    """
    want, avoid = ZONE.get(policy), NOT_ZONE.get(policy)
    if want is None and avoid is None:
        return []
    return [
        b
        for b in walk(sysfs, detail=True)
        if b.state == "online"
        and b.zone is not None
        and (b.zone != want if want else b.zone == avoid)
        and hot_pluggable(sysfs, b.number)
    ]


def move_misplaced(
    sysfs: Sysfs, policy: MemoryPolicy, *, offline_timeout: float = OFFLINE_TIMEOUT
) -> list[Onlined]:
    """Offline each misplaced block and online it as ``policy`` says; each step's outcome.

    Highest block first, as :func:`plan_onlining` onlines. A block the kernel will not
    offline (``EBUSY``: unmovable pages landed in it; or still trying after
    ``offline_timeout`` seconds, when the kernel gives up on the signal) stays where it
    is and is reported with its error; ``modstage status`` shows it as misplaced.
    """
    done: list[Onlined] = []
    for block in sorted(misplaced(sysfs, policy), key=lambda b: b.number, reverse=True):
        started = time.monotonic()
        state = f"{MEMORY}/memory{block.number}/state"
        try:
            with _deadline(offline_timeout):
                sysfs.write(state, "offline")
        except (OSError, _Expired) as exc:
            why = f"cannot offline it to move it: {_reason(exc)}"
            done.append(Onlined(block.number, policy.value, moved_from=block.zone, error=why))
            continue
        try:
            sysfs.write(state, policy.value)
        except OSError as exc:  # offline now: the daemon or the next boot retries it
            why = f"offlined, but onlining failed: {_reason(exc)}"
            done.append(Onlined(block.number, policy.value, moved_from=block.zone, error=why))
            continue
        ms = round((time.monotonic() - started) * 1000, 3)
        done.append(Onlined(block.number, policy.value, ms, moved_from=block.zone))
    return done


class _Expired(Exception):
    def __str__(self) -> str:
        return "timed out"


def _reason(exc: Exception) -> str:
    return exc.strerror or str(exc) if isinstance(exc, OSError) else str(exc)


@contextlib.contextmanager
def _deadline(seconds: float) -> Iterator[None]:
    """Interrupt a blocking sysfs write after ``seconds`` (main thread only; else no limit).

    Offlining retries while pages fail to migrate until a signal is pending; the alarm's
    handler raises, so the interrupted write(2) is not restarted. An alarm the caller set
    is kept: this one fires no later than it, and it is re-armed afterwards.
    """
    if threading.current_thread() is not threading.main_thread() or seconds <= 0:
        yield
        return

    def expire(signum: int, frame: object) -> None:
        raise _Expired

    outer = signal.getitimer(signal.ITIMER_REAL)[0]  # a caller's own alarm is kept
    started = time.monotonic()
    previous = signal.signal(signal.SIGALRM, expire)
    signal.setitimer(signal.ITIMER_REAL, min(seconds, outer) if outer else seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
        if outer:  # re-armed for what is left of it (at once if it is due)
            left = outer - (time.monotonic() - started)
            signal.setitimer(signal.ITIMER_REAL, max(left, 1e-6))


def hand_over(sysfs: Sysfs) -> bool:
    """Keep the kernel from onlining hot-added memory so the daemon's policy can do it.

    A kernel built to online by itself (Debian 13's 6.12: ``auto_online_blocks`` is
    ``online`` at boot) puts a block in ZONE_NORMAL before its uevent; ``offline`` leaves
    it for the daemon. Any other value was chosen by someone (a bundle's policy at boot,
    an admin) and is kept. Whether it wrote.
    """
    path = f"{MEMORY}/auto_online_blocks"
    try:
        if sysfs.read(path) != MemoryPolicy.ONLINE.value:
            return False
        return sysfs.write(path, MemoryPolicy.OFFLINE.value)
    except OSError:  # no memory hotplug in this kernel
        return False

"""Memory hotplug onlining: pure plans over block states, applied through sysfs.

``auto_online_blocks`` decides what the kernel does with blocks added later;
blocks already present and offline are onlined by modstage as the policy says.
Order: since Linux 4.13 zones may overlap, and 6.1 puts a block written
``online_movable`` into ZONE_MOVABLE whatever its neighbours (``zone_for_pfn_range``
with MMOP_ONLINE_MOVABLE), so the order no longer decides the zone. Blocks are still
onlined highest first for ``online_movable``, which is harmless and keeps the movable
range contiguous at the top on older kernels.
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from service.kernel.sysfs import Sysfs
from stager.manifest import MemoryPolicy

MEMORY = "devices/system/memory"
_BLOCK = re.compile(r"memory(\d+)\Z")
_NODE = re.compile(r"node(\d+)\Z")


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

    def fields(self) -> dict[str, object]:
        """The step as it is logged."""
        if self.block is None:
            return {"auto_online_blocks": self.state}
        if self.error is not None:
            return {"block": self.block, "state": self.state, "error": self.error}
        return {"block": self.block, "state": self.state, "latency_ms": self.latency_ms}


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


def apply_policy(sysfs: Sysfs, policy: MemoryPolicy) -> list[Onlined]:
    """Set ``auto_online_blocks`` and online present blocks; return what was done."""
    done: list[Onlined] = []
    if sysfs.write(f"{MEMORY}/auto_online_blocks", policy.value):
        done.append(Onlined(None, policy.value))
    return done + online_blocks(sysfs, policy)

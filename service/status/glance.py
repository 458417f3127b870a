"""At a glance: times in UTC, the daemon's heartbeat, when the reboot window opens next,
and why no reboot was asked for yet. Pure functions except the heartbeat file's I/O.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any
from zoneinfo import ZoneInfo

from service.window import Window
from stager.atomic import write_atomic

HEARTBEAT_EVERY = 30.0  # seconds between the daemon's heartbeats
HEARTBEAT_STALE = 4 * HEARTBEAT_EVERY  # older than this: the daemon is not alive


def iso(epoch: float | None) -> str | None:
    """UTC ISO 8601 (``2026-12-01T03:55:25Z``) for an epoch time; None when unknown."""
    if not epoch:
        return None
    return datetime.fromtimestamp(epoch, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def next_open(window: Window, now: datetime) -> datetime | None:
    """``now`` if the window is open, else the next moment it opens (within 8 days)."""
    if window.contains(now):
        return now
    zone = ZoneInfo(window.timezone)
    local = now.astimezone(zone)
    for days in range(0, 9):
        day = (local + timedelta(days=days)).date()
        start = datetime.combine(day, window.start, tzinfo=zone)
        if start > now and window.contains(start):
            return start.astimezone(UTC)
    return None


def write_heartbeat(path: Path, *, decision: str, at: float) -> None:
    """The daemon's heartbeat: when it last went round its loop, and its reboot decision."""
    path.parent.mkdir(parents=True, exist_ok=True)
    doc = {"at": at, "pid": os.getpid(), "reboot_decision": decision}
    write_atomic(path, json.dumps(doc, sort_keys=True).encode() + b"\n")


@dataclass(frozen=True)
class Heartbeat:
    """The daemon's heartbeat as status shows it (``at`` None: no readable heartbeat)."""

    path: str
    alive: bool
    at: str | None = None
    age_seconds: float | None = None
    decision: str | None = ""

    def to_json(self) -> dict[str, Any]:
        """The ``daemon`` object."""
        return {
            "path": self.path,
            "alive": self.alive,
            "at": self.at,
            "age_seconds": self.age_seconds,
            "decision": self.decision,
        }


def read_heartbeat(path: Path, now: float) -> Heartbeat:
    """The heartbeat as ``status`` shows it: alive, age, the daemon's last reboot decision."""
    try:
        doc = json.loads(path.read_bytes())
        at = float(doc["at"])
    except (OSError, ValueError, KeyError, TypeError):
        return Heartbeat(str(path), alive=False)
    age = max(0.0, now - at)
    decision = doc.get("reboot_decision") if isinstance(doc, dict) else None
    return Heartbeat(
        str(path),
        alive=age <= HEARTBEAT_STALE,
        at=iso(at),
        age_seconds=round(age, 1),
        decision=decision if isinstance(decision, str) else None,
    )


def why_no_reboot(
    *,
    required: bool,
    asked: Mapping[str, Any] | None,
    backend: str | None,
    daemon: Heartbeat,
    opens: datetime | None,
    now: datetime,
    waits: list[str],
) -> str:
    """One line: why no reboot was asked for yet (or that one was)."""
    if not required:
        return "; ".join(waits) or "no generation waits for a reboot"
    if asked:
        if asked.get("backend") == "none":
            return f"waiting for an admin reboot (backend none; due since {iso(asked.get('at'))})"
        return f"asked via {asked.get('backend')} at {iso(asked.get('at'))}"
    if backend is None:
        return "the config is invalid: the daemon cannot run, nobody asks for the reboot"
    if backend == "none":
        return "waiting for an admin reboot (backend none; or kured's sentinel command)"
    if not daemon.alive:
        return "the daemon is not running (no recent heartbeat): nobody asks for the reboot"
    if opens is None:
        return "the reboot window never opens"
    if opens > now:
        return f"outside the reboot window; it opens at {iso(opens.timestamp())}"
    return f"the daemon decided: {daemon.decision or 'not yet decided'}"

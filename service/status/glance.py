"""At a glance: times in UTC, the daemon's heartbeat, and why no reboot was asked for yet.

Pure functions except the heartbeat file's I/O.
"""

from __future__ import annotations

import dataclasses
import json
import os
from datetime import UTC, datetime
from pathlib import Path

from service.bundles.records import RebootIntent
from service.rebooting.backends import admin_reboots
from stager.schema.atomic import write_atomic

HEARTBEAT_EVERY = 30.0  # seconds between the daemon's heartbeats
HEARTBEAT_STALE = 4 * HEARTBEAT_EVERY  # older than this: the daemon is not alive


def iso(epoch: float | None) -> str | None:
    """UTC ISO 8601 (``2026-12-01T03:55:25Z``) for an epoch time; None when unknown."""
    if not epoch:
        return None
    return datetime.fromtimestamp(epoch, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


#: the heartbeat's decision once the daemon has stopped (it is not alive, whatever its age)
STOPPED = "stopped"


def write_heartbeat(path: Path, *, decision: str, at: float, paused: str | None = None) -> None:
    """The daemon's heartbeat: when it last went round its loop, its reboot decision
    (:data:`STOPPED` as it stops), and why it takes no drop in (``paused``; None: it does)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    doc = {"at": at, "pid": os.getpid(), "reboot_decision": decision, "intake_paused": paused}
    write_atomic(path, json.dumps(doc, sort_keys=True).encode() + b"\n")


@dataclasses.dataclass(frozen=True)
class Heartbeat:
    """The daemon's heartbeat as status shows it (``at`` None: no readable heartbeat)."""

    path: str
    alive: bool
    at: str | None = None
    age_seconds: float | None = None
    decision: str | None = ""
    intake_paused: str | None = None  # why the daemon takes no drop in (None: it does)


def read_heartbeat(path: Path, now: float) -> Heartbeat:
    """The heartbeat as ``status`` shows it: alive, age, the daemon's last reboot decision."""
    try:
        doc = json.loads(path.read_bytes())
        at = float(doc["at"])
    except (OSError, ValueError, KeyError, TypeError):
        return Heartbeat(str(path), alive=False)
    age = max(0.0, now - at)
    decision = doc.get("reboot_decision") if isinstance(doc, dict) else None
    paused = doc.get("intake_paused") if isinstance(doc, dict) else None
    return Heartbeat(
        str(path),
        alive=age <= HEARTBEAT_STALE and decision != STOPPED,
        at=iso(at),
        age_seconds=round(age, 1),
        decision=decision if isinstance(decision, str) else None,
        intake_paused=paused if isinstance(paused, str) else None,
    )


def why_no_reboot(
    *,
    required: bool,
    asked: RebootIntent | None,
    backend: str | None,
    daemon: Heartbeat,
    opens: datetime | None,
    now: datetime,
    waits: list[str],
) -> str:
    """One line: why no reboot was asked for yet (or that one was)."""
    if not required:
        return "; ".join(waits) or "no generation waits for a reboot"
    if asked is not None:
        if admin_reboots(asked.backend):
            why = f"backend {asked.backend}; due since {iso(asked.at)}"
            return f"waiting for an admin reboot ({why})"
        return f"asked via {asked.backend} at {iso(asked.at)}"
    if backend is None:
        return "the config is invalid: the daemon cannot run, nobody asks for the reboot"
    if admin_reboots(backend):
        return f"waiting for an admin reboot (backend {backend}; or kured's sentinel command)"
    if not daemon.alive:
        return "the daemon is not running (no recent heartbeat): nobody asks for the reboot"
    if opens is None:
        return "the reboot window never opens"
    if opens > now:
        return f"outside the reboot window; it opens at {iso(opens.timestamp())}"
    return f"the daemon decided: {daemon.decision or 'not yet decided'}"

"""The ``status`` document as typed records; JSON only at the edge (:meth:`Report.to_json`).

:func:`service.status.collect.collect` builds a :class:`Report`; the views and the
metrics read its fields. ``to_json`` gives ``status --json`` (schema 1 in
``docs/status.md``): key for key what it always printed.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from service.status.glance import Heartbeat
from service.status.health import Health
from service.status.live import LiveModule
from service.store.quarantine import Record
from stager.statusfile import StatusFile

SCHEMA = 1


@dataclass(frozen=True)
class GenerationRow:
    """One generation of a bundle as status shows it; ``role`` is what it is to the bundle."""

    id: str
    version: str
    kernel: str
    added: float
    added_utc: str | None
    attempts: int
    failed: str | None
    role: str

    def to_json(self) -> dict[str, Any]:
        """The ``generations[]`` entry."""
        return {
            "id": self.id,
            "version": self.version,
            "kernel": self.kernel,
            "added": self.added,
            "added_utc": self.added_utc,
            "attempts": self.attempts,
            "failed": self.failed,
            "role": self.role,
        }


@dataclass(frozen=True)
class LoadedRow:
    """One module of the active generation: as recorded at load, and as the kernel has it."""

    module: str
    srcversion: str | None
    ms: float | None
    already_loaded: bool
    live: LiveModule | None

    def to_json(self) -> dict[str, Any]:
        """The ``loaded[]`` entry."""
        now = self.live
        return {
            "module": self.module,
            "srcversion": self.srcversion,
            "ms": self.ms,
            "already_loaded": self.already_loaded,
            "live": None
            if now is None
            else {"srcversion": now.srcversion, "version": now.version, "refcnt": now.refcnt},
        }


@dataclass(frozen=True)
class HistoryRow:
    """One recorded move of a bundle (an admin's verb has ``from_ == to``)."""

    at: float | None
    at_utc: str | None
    from_: str | None
    to: str | None
    note: str | None

    def to_json(self) -> dict[str, Any]:
        """The ``history[]`` entry."""
        return {
            "at": self.at,
            "at_utc": self.at_utc,
            "from": self.from_,
            "to": self.to,
            "note": self.note,
        }


@dataclass(frozen=True)
class BundleReport:
    """One bundle: persisted state, health and its reasons, and its last status file."""

    phase: str
    health: Health
    reasons: tuple[str, ...]
    active: str | None
    pending: str | None
    last_known_good: str | None
    held: bool
    waiting: str | None
    generations: tuple[GenerationRow, ...]
    loaded: tuple[LoadedRow, ...]
    history: tuple[HistoryRow, ...]
    status_file: StatusFile | None
    errors: tuple[str, ...]

    def to_json(self) -> dict[str, Any]:
        """The ``bundles.<name>`` object."""
        return {
            "phase": self.phase,
            "health": self.health.label,
            "reasons": list(self.reasons),
            "active": self.active,
            "pending": self.pending,
            "last_known_good": self.last_known_good,
            "held": self.held,
            "waiting": self.waiting,
            "generations": [g.to_json() for g in self.generations],
            "loaded": [m.to_json() for m in self.loaded],
            "history": [h.to_json() for h in self.history],
            "status_file": None if self.status_file is None else self.status_file.to_dict(),
            "errors": list(self.errors),
        }


@dataclass(frozen=True)
class Problem:
    """One reason the host or a bundle (``bundle``; None: the host) is not healthy."""

    bundle: str | None
    health: Health
    reason: str

    def to_json(self) -> dict[str, Any]:
        """The ``problems[]`` entry."""
        return {"bundle": self.bundle, "health": self.health.label, "reason": self.reason}


@dataclass(frozen=True)
class WindowRow:
    """The configured reboot window (times as ``HH:MM:SS``)."""

    days: tuple[str, ...]
    start: str
    end: str
    timezone: str

    def to_json(self) -> dict[str, Any]:
        """The ``reboot.window`` object."""
        return {
            "days": list(self.days),
            "start": self.start,
            "end": self.end,
            "timezone": self.timezone,
        }


@dataclass(frozen=True)
class RebootReport:
    """Whether a reboot is required, asked for, and why not yet (``reboot``)."""

    required: bool
    bundles: tuple[str, ...]
    scheduled: tuple[str, ...]
    asked: Mapping[str, Any] | None
    backend: str | None
    window: WindowRow | None
    next_window: str | None
    window_open: bool
    why_not_asked: str
    sentinel: str
    sentinel_present: bool

    def to_json(self) -> dict[str, Any]:
        """The ``reboot`` object."""
        return {
            "required": self.required,
            "bundles": list(self.bundles),
            "scheduled": list(self.scheduled),
            "asked": None if self.asked is None else dict(self.asked),
            "backend": self.backend,
            "window": None if self.window is None else self.window.to_json(),
            "next_window": self.next_window,
            "window_open": self.window_open,
            "why_not_asked": self.why_not_asked,
            "sentinel": {"path": self.sentinel, "present": self.sentinel_present},
        }


@dataclass(frozen=True)
class MemoryRow:
    """Memory blocks of one NUMA node (None: unknown), zone (online only) and state."""

    node: int | None
    zone: str | None
    state: str
    blocks: int

    def to_json(self) -> dict[str, Any]:
        """The ``memory[]`` entry."""
        return {"node": self.node, "zone": self.zone, "state": self.state, "blocks": self.blocks}


@dataclass(frozen=True)
class Report:
    """Everything ``modstage status`` shows about the host."""

    health: Health
    kernel: str | None
    boot_id: str | None
    generated_utc: str | None
    state_path: str
    state_error: str | None
    state_boot_id: str | None
    config_path: str
    config_error: str | None
    daemon: Heartbeat
    reboot: RebootReport
    problems: tuple[Problem, ...]
    bundles: Mapping[str, BundleReport]
    memory: tuple[MemoryRow, ...]
    quarantine: tuple[Record, ...]

    @property
    def exit_code(self) -> int:
        """``status``'s exit code: 0 healthy, 1 degraded, 2 failed."""
        return int(self.health)

    def to_json(self) -> dict[str, Any]:
        """The ``status --json`` document (schema :data:`SCHEMA`)."""
        return {
            "schema": SCHEMA,
            "health": self.health.label,
            "exit_code": self.exit_code,
            "kernel": self.kernel,
            "boot_id": self.boot_id,
            "generated_utc": self.generated_utc,
            "state": {
                "path": self.state_path,
                "error": self.state_error,
                "boot_id": self.state_boot_id,
            },
            "config": {"path": self.config_path, "error": self.config_error},
            "daemon": self.daemon.to_json(),
            "reboot": self.reboot.to_json(),
            "problems": [p.to_json() for p in self.problems],
            "bundles": {name: b.to_json() for name, b in self.bundles.items()},
            "memory": [m.to_json() for m in self.memory],
            "quarantine": [r.to_dict() for r in self.quarantine],
        }

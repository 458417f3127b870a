"""``[reboot]`` of ``config.toml``: how and when to ask for a reboot, read and checked."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import time
from pathlib import Path
from typing import Any

from service.config_values import shown, strings
from service.rebooting.backends import BACKENDS
from service.rebooting.window import DAYS, Guard, Window, zone

_WHOLE_DAYS = ("sunday", "monday", "tuesday", "wednesday", "thursday", "friday", "saturday")
#: a day is named by its first three letters (``DAYS``) or whole, in any case
DAY_NAMES = {**{d: d for d in DAYS}, **{w: w[:3] for w in _WHOLE_DAYS}}


@dataclass(frozen=True)
class RebootConfig:
    """How and when to ask for a reboot."""

    backend: str = "none"
    command: tuple[str, ...] = ()
    sentinel: Path | None = None
    window: Window = field(default_factory=Window)
    guard: Guard = field(default_factory=Guard)
    # seconds a bundle may be without its driver for a pending upgrade before status calls
    # it failed; None: :meth:`upgrading_limit`'s default
    upgrading_bound: float | None = None

    def upgrading_limit(self) -> float:
        """How long a bundle may be ``upgrading`` (its modules unloaded for a pending
        generation) before it is failed: ``upgrading_bound``, else the window's longest
        closed stretch plus ``min_delay`` and :data:`UPGRADING_MARGIN`, so a closed window
        alone never makes an upgrade a failure."""
        if self.upgrading_bound is not None:
            return self.upgrading_bound
        return self.window.longest_closed() + self.guard.min_delay + UPGRADING_MARGIN


#: beyond the window's longest closed stretch: kured's period (1 h by default), a drain,
#: the reboot itself, and slack
UPGRADING_MARGIN = 2 * 3600.0


REBOOT_KEYS = {
    "backend",
    "command",
    "sentinel",
    "days",
    "start",
    "end",
    "timezone",
    "min_delay",
    "min_interval",
    "upgrading_bound",
}


def reboot_table(value: Any, _: str, problems: list[str]) -> RebootConfig:
    if not isinstance(value, dict):
        problems.append(f"reboot: {shown(value)} is not a table")
        return RebootConfig()
    problems += [f"reboot.{k}: unknown key" for k in sorted(set(value) - REBOOT_KEYS)]
    backend = value.get("backend", "none")
    chosen = BACKENDS.get(backend) if isinstance(backend, str) else None
    if chosen is None:
        problems.append(f"reboot.backend: {shown(backend)} is not one of {'|'.join(BACKENDS)}")
    command = strings(value.get("command", []), "reboot.command", problems)
    if chosen is not None and chosen.needs_command and not command:
        problems.append(f'reboot.command: required (non-empty argv) for backend = "{backend}"')
    given = strings(value.get("days", []), "reboot.days", problems)
    problems += [
        f"reboot.days: {shown(d)} is not a day (sun..sat)"
        for d in given
        if d.lower() not in DAY_NAMES
    ]
    days = tuple(DAY_NAMES.get(d.lower(), d) for d in given)
    window = Window(
        days=days,
        start=_clock(value.get("start", "00:00"), "reboot.start", problems),
        end=_clock(value.get("end", "23:59:59"), "reboot.end", problems),
        timezone=_zone(value.get("timezone", "UTC"), problems),
    )
    guard = Guard(
        **{
            k: float(_seconds(value[k], f"reboot.{k}", problems))
            for k in ("min_delay", "min_interval")
            if k in value
        }
    )
    sentinel = value.get("sentinel")
    if sentinel is not None and not isinstance(sentinel, str):
        problems.append(f"reboot.sentinel: {shown(sentinel)} is not a path (a string)")
        sentinel = None
    bound = value.get("upgrading_bound")
    return RebootConfig(
        backend=backend,
        command=command,
        sentinel=Path(sentinel) if sentinel else None,
        window=window,
        guard=guard,
        upgrading_bound=None
        if bound is None
        else _seconds(bound, "reboot.upgrading_bound", problems),
    )


def _clock(value: Any, key: str, problems: list[str]) -> time:
    try:
        return time.fromisoformat(value)
    except (TypeError, ValueError):
        problems.append(f'{key}: {shown(value)} is not a quoted time of day like "22:00"')
        return time(0, 0)


def _zone(value: Any, problems: list[str]) -> str:
    from zoneinfo import TZPATH, ZoneInfoNotFoundError  # the [reboot] table's only

    try:
        zone(value)
    except (TypeError, ValueError, ZoneInfoNotFoundError):
        found = any(Path(directory, "UTC").exists() for directory in TZPATH)
        tzdata = "" if found else " (no time zone database: is tzdata installed?)"
        problems.append(f"reboot.timezone: {shown(value)} is not a known time zone{tzdata}")
        return "UTC"
    return str(value)


def _seconds(value: Any, key: str, problems: list[str]) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or value < 0:
        problems.append(f"{key}: {shown(value)} is not a non-negative number of seconds")
        return 0.0
    return float(value)

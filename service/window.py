"""Reboot windows with kured's semantics, and the decision whether to ask now.

A window is a set of weekdays and a time-of-day range in a time zone. As in
kured, the end may be earlier than the start (the window spans midnight; the
day that counts is the day it started), and an empty day list means every day.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, time, timedelta
from zoneinfo import ZoneInfo

DAYS = ("sun", "mon", "tue", "wed", "thu", "fri", "sat")


@dataclass(frozen=True)
class Window:
    """When reboots may happen."""

    days: tuple[str, ...] = DAYS
    start: time = time(0, 0)
    end: time = time(23, 59, 59)
    timezone: str = "UTC"

    def contains(self, when: datetime) -> bool:
        """Whether the aware datetime ``when`` lies in the window."""
        local = when.astimezone(ZoneInfo(self.timezone))
        days = self.days or DAYS
        now = local.time()
        if self.start <= self.end:
            return _day(local) in days and self.start <= now <= self.end
        if now >= self.start:
            return _day(local) in days
        return now <= self.end and _day(local - timedelta(days=1)) in days


def _day(when: datetime) -> str:
    return DAYS[(when.weekday() + 1) % 7]


@dataclass(frozen=True)
class Guard:
    """Limits on asking: wait after the last drop, never ask again too soon."""

    min_delay: float = 60.0  # seconds after the last drop before asking
    min_interval: float = 3600.0  # seconds between two requests


def reboot_due(
    now: datetime,
    *,
    waiting: bool,
    last_drop: float | None,
    last_request: float | None,
    window: Window,
    guard: Guard,
) -> tuple[bool, str]:
    """Whether to ask for a reboot now, and why (or why not)."""
    stamp = now.timestamp()
    if not waiting:
        return False, "no generation waits for a reboot"
    if last_drop is not None and stamp - last_drop < guard.min_delay:
        return False, f"waiting {guard.min_delay - (stamp - last_drop):.0f} s after the last drop"
    if last_request is not None and stamp - last_request < guard.min_interval:
        left = guard.min_interval - (stamp - last_request)
        return False, f"a reboot was asked for {stamp - last_request:.0f} s ago ({left:.0f} s left)"
    if not window.contains(now):
        return False, "outside the reboot window"
    return True, "due"

"""Reboot windows with kured's semantics, and the decision whether to ask now.

A window is a set of weekdays and a time-of-day range in a time zone. As in
kured, the end may be earlier than the start (the window spans midnight; the
day that counts is the day it started), and an empty day list means every day.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from datetime import UTC, datetime, time, timedelta, tzinfo

DAYS = ("sun", "mon", "tue", "wed", "thu", "fri", "sat")


def zone(name: str) -> tzinfo:
    """The time zone ``name``: ``UTC`` built in (a host without tzdata, as slim images are,
    knows it), any other from the system's tz database (ZoneInfoNotFoundError without it)."""
    if name == "UTC":
        return UTC
    from zoneinfo import ZoneInfo  # not on the boot path, which has no window

    return ZoneInfo(name)


@dataclass(frozen=True)
class Window:
    """When reboots may happen."""

    days: tuple[str, ...] = DAYS
    start: time = time(0, 0)
    end: time = time(23, 59, 59)
    timezone: str = "UTC"

    def contains(self, when: datetime) -> bool:
        """Whether the aware datetime ``when`` lies in the window."""
        local = when.astimezone(zone(self.timezone))
        days = self.days or DAYS
        now = local.time()
        if self.start <= self.end:
            return _day(local) in days and self.start <= now <= self.end
        if now >= self.start:
            return _day(local) in days
        return now <= self.end and _day(local - timedelta(days=1)) in days

    def next_open(self, now: datetime) -> datetime | None:
        """``now`` if the window is open, else the next moment it opens (within 8 days)."""
        if self.contains(now):
            return now
        local_zone = zone(self.timezone)
        local = now.astimezone(local_zone)
        for days in range(0, 9):
            day = (local + timedelta(days=days)).date()
            start = datetime.combine(day, self.start, tzinfo=local_zone)
            if start > now and self.contains(start):
                return start.astimezone(UTC)
        return None

    def longest_closed(self) -> float:
        """The longest stretch in a week, in seconds, during which the window is shut (0
        when it is always open; a whole week when it never opens), read from its days and
        hours in its own time zone (a daylight-saving shift moves it by an hour at most)."""
        week, day = 7 * 86400, 86400
        start = self.start.hour * 3600 + self.start.minute * 60 + self.start.second
        end = self.end.hour * 3600 + self.end.minute * 60 + self.end.second
        length = end - start if end >= start else end + day - start
        opens = sorted(DAYS.index(d) * day + start for d in set(self.days or DAYS))
        if not opens:
            return float(week)
        gaps = []
        for i, begin in enumerate(opens):
            following = opens[(i + 1) % len(opens)] + (week if i + 1 == len(opens) else 0)
            gaps.append(max(0, following - (begin + length)))
        longest = max(gaps)
        return 0.0 if longest <= 1 else float(longest)  # 23:59:59 to 00:00: always open


def _day(when: datetime) -> str:
    return DAYS[(when.weekday() + 1) % 7]


@dataclass(frozen=True)
class Guard:
    """Limits on asking: wait after the last drop, never ask again too soon."""

    min_delay: float = 60.0  # seconds after the last drop before asking
    min_interval: float = 3600.0  # seconds between two requests


class Why(enum.Enum):
    """Why a reboot is (not) asked for now; :meth:`Decision.text` says it in English."""

    NOTHING_WAITS = "nothing-waits"
    AFTER_DROP = "after-drop"  # min_delay after the last drop has not passed
    TOO_SOON = "too-soon"  # min_interval after the last request has not passed
    OUTSIDE_WINDOW = "outside-window"
    HELD = "held"  # the next kernel's gate (service.rebooting.gate): ``note`` says it
    DUE = "due"


@dataclass(frozen=True)
class Decision:
    """The typed answer of :func:`reboot_due`, with the numbers behind it.

    ``left``: seconds until what ``why`` names lets a request through (AFTER_DROP,
    TOO_SOON: the guard runs out; OUTSIDE_WINDOW: the window opens); ``since``: seconds
    since the last request (TOO_SOON); ``opens``: when the window opens next
    (OUTSIDE_WINDOW; None, and ``left`` None, if it never opens within 8 days); ``note``:
    the next kernel's gate in English (HELD, ``left`` until its bound).
    """

    why: Why
    left: float | None = None
    since: float | None = None
    opens: datetime | None = None
    note: str | None = None

    @property
    def due(self) -> bool:
        """Whether to ask for a reboot now."""
        return self.why is Why.DUE

    def recheck(self, every: float) -> float | None:
        """Seconds until the decision may change by time alone; None: only an event changes it.

        A decision that is due or has nothing waiting is not re-checked; any other is
        re-checked every ``every`` seconds, sooner when what holds it back runs out before
        that (never sooner than a second: wall and monotonic time drift apart).
        """
        if self.why in (Why.DUE, Why.NOTHING_WAITS):
            return None
        return every if self.left is None else min(every, max(1.0, self.left))

    def text(self) -> str:
        """The decision in English, as the heartbeat and ``status`` show it."""
        if self.why is Why.NOTHING_WAITS:
            return "no generation waits for a reboot"
        if self.why is Why.AFTER_DROP:
            return f"waiting {self.left or 0:.0f} s after the last drop"
        if self.why is Why.TOO_SOON:
            return (
                f"a reboot was asked for {self.since or 0:.0f} s ago ({self.left or 0:.0f} s left)"
            )
        if self.why is Why.OUTSIDE_WINDOW:
            return "outside the reboot window"
        if self.why is Why.HELD:
            return self.note or "held for the next kernel"
        return "due"


def reboot_due(
    now: datetime,
    *,
    waiting: bool,
    last_drop: float | None,
    last_request: float | None,
    window: Window,
    guard: Guard,
) -> Decision:
    """Whether to ask for a reboot now, and why (or why not)."""
    stamp = now.timestamp()
    if not waiting:
        return Decision(Why.NOTHING_WAITS)
    if last_drop is not None and stamp - last_drop < guard.min_delay:
        return Decision(Why.AFTER_DROP, left=guard.min_delay - (stamp - last_drop))
    if last_request is not None and stamp - last_request < guard.min_interval:
        since = stamp - last_request
        return Decision(Why.TOO_SOON, left=guard.min_interval - since, since=since)
    if not window.contains(now):
        opens = window.next_open(now)
        left = None if opens is None else (opens - now).total_seconds()
        return Decision(Why.OUTSIDE_WINDOW, left=left, opens=opens)
    return Decision(Why.DUE)

"""The daemon's clock: wall time for windows and records, monotonic time for deadlines,
and the loop's one wait (on its event queue, until the next deadline).

Every wait of the loop goes through :meth:`Clock.wait`, so a test can drive the loop
with a clock that jumps to the deadline instead of sleeping.
"""

from __future__ import annotations

import queue
import time
from datetime import UTC, datetime
from typing import Protocol

from service.daemon.events import Event, Queue


class Clock(Protocol):
    """Wall time for windows and records, monotonic time for deadlines, and waiting."""

    def now(self) -> datetime: ...
    def monotonic(self) -> float: ...
    def wait(self, events: Queue, timeout: float) -> Event | None:
        """The next event, or None once ``timeout`` seconds passed without one."""


class SystemClock:
    """The real clock."""

    def now(self) -> datetime:
        """Aware current time."""
        return datetime.now(UTC)

    def monotonic(self) -> float:
        """time.monotonic()."""
        return time.monotonic()

    def wait(self, events: Queue, timeout: float) -> Event | None:
        """Block on the queue for at most ``timeout`` seconds."""
        try:
            return events.get(timeout=timeout)
        except queue.Empty:
            return None

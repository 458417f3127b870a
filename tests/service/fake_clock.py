"""A clock the tests drive: the daemon's waits jump to their deadline instead of sleeping."""

from __future__ import annotations

import heapq
import itertools
import queue
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime

from service.daemon.events import Event, Kind, Queue

NOON = datetime(2026, 12, 1, 12, 0, tzinfo=UTC).timestamp()  # a Tuesday


@dataclass
class FakeClock:
    """Wall and monotonic time that move only when the daemon waits or a test advances them.

    :meth:`wait` returns a queued event at once; with none queued it advances both clocks
    by the whole timeout (the deadline the loop waits for comes at once). Past
    ``stop_at`` (monotonic) it returns a stop event, so ``Daemon.loop`` runs a span of
    fake time synchronously and returns. ``waits`` records every timeout asked for.
    Actions scheduled with :meth:`at` run when a wait passes their time (the clock stops
    there first), as something the world does while the daemon sleeps: they wake the
    loop only if they queue an event.
    """

    wall: float = NOON
    mono: float = 1000.0
    stop_at: float = float("inf")
    waits: list[float] = field(default_factory=list)
    scheduled: list[tuple[float, int, Callable[[], None]]] = field(default_factory=list)
    _order: itertools.count[int] = field(default_factory=itertools.count)

    def now(self) -> datetime:
        """The fake wall time."""
        return datetime.fromtimestamp(self.wall, UTC)

    def monotonic(self) -> float:
        """The fake monotonic time."""
        return self.mono

    def advance(self, seconds: float) -> None:
        """Let ``seconds`` pass on both clocks."""
        self.wall += seconds
        self.mono += seconds

    def at(self, when: float, action: Callable[[], None]) -> None:
        """Run ``action`` once the monotonic time reaches ``when`` during a wait."""
        heapq.heappush(self.scheduled, (when, next(self._order), action))

    def wait(self, events: Queue, timeout: float) -> Event | None:
        """A queued event, else jump ``timeout`` ahead (or to ``stop_at``, and stop)."""
        self.waits.append(timeout)
        assert len(self.waits) < 100_000, "the loop spins without waiting"
        start, deadline = self.mono, self.mono + timeout
        while True:
            try:
                return events.get_nowait()
            except queue.Empty:
                pass
            if not self.scheduled or self.scheduled[0][0] > min(deadline, self.stop_at):
                break
            when, _n, action = heapq.heappop(self.scheduled)
            self.advance(max(0.0, when - self.mono))
            action()
        if deadline >= self.stop_at:
            self.advance(max(0.0, self.stop_at - self.mono))
            return Event(Kind.STOP, "fake clock: stop_at", at=self.mono)
        self.advance(deadline - self.mono if self.mono != start else timeout)
        return None

    def run_for(self, seconds: float) -> None:
        """Let the loop run ``seconds`` of fake time from now (set ``stop_at``)."""
        self.stop_at = self.mono + seconds

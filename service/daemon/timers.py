"""The daemon loop's deadlines, on the monotonic clock."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class Timers:
    """When the loop must act next without an event; None: not armed.

    Mutable on purpose: it is the loop's own bookkeeping, owned by its one thread.
    """

    rescan: float  # the periodic rescan of the incoming directories
    dirty: float | None = None  # the debounced scan after drop events
    kernel: float | None = None  # the debounced refresh after a kernel's files changed
    check: float | None = None  # re-decide a reboot while a generation waits
    metrics: float | None = None  # rewrite metrics once hot-added memory settles
    ping: float | None = None  # the next WATCHDOG=1 (None: no watchdog)
    ping_every: float = 0.0  # half the watchdog interval

    @classmethod
    def start(cls, now: float, rescan_every: float, watchdog: float | None) -> Timers:
        """At start: scan at once, rescan periodically, ping at once if there is a watchdog."""
        ping = now if watchdog else None
        return cls(rescan=now + rescan_every, dirty=now, ping=ping, ping_every=(watchdog or 0) / 2)

    def earliest(self, also: float) -> float:
        """The first armed deadline, or ``also`` (the heartbeat) if that comes first."""
        armed = (self.rescan, self.dirty, self.kernel, self.check, self.metrics, self.ping)
        return min([t for t in armed if t is not None] + [also])

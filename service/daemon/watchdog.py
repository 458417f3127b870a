"""systemd's watchdog during long steps: fed while the step makes progress.

The loop pings between steps (see :class:`service.daemon.loop.Daemon`); a step that
takes long (intake of a large drop) calls :meth:`Watchdog.feed` as it progresses, and
:meth:`Watchdog.feeding` covers the stretches where it cannot. Real time throughout:
this measures a real thread's progress.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass

from service.daemon.notify import notify, watchdog_interval


@dataclass
class Watchdog:
    """When the watchdog was last fed, and when the current step last made progress."""

    fed_at: float = float("-inf")
    progress_at: float = 0.0

    def feed(self) -> None:
        """Progress in a long step (intake calls it per drop and per chunk): we are alive."""
        now = time.monotonic()
        self.progress_at = now
        ping = watchdog_interval()
        if ping and now >= self.fed_at + ping / 2:
            notify("WATCHDOG=1")
            self.fed_at = now

    @contextlib.contextmanager
    def feeding(self, budget: float) -> Iterator[None]:
        """Keep the watchdog fed during a step while it makes progress.

        A step that cannot call :meth:`feed` for a while (parsing a large manifest) is
        covered by a thread that feeds the watchdog as long as the last progress is
        younger than ``budget`` seconds (``limits.max_seconds``): a step stuck longer
        than a drop may take is left to systemd's watchdog, as it should be.
        """
        ping = watchdog_interval()
        if not ping:
            yield
            return
        stop = threading.Event()
        self.progress_at = time.monotonic()

        def feed() -> None:
            while not stop.wait(ping / 2):
                if time.monotonic() - self.progress_at < budget:
                    notify("WATCHDOG=1")

        thread = threading.Thread(target=feed, name="watchdog-feeder", daemon=True)
        thread.start()
        try:
            yield
        finally:
            stop.set()
            thread.join()

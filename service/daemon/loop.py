"""``modstage serve``: notice drops, take them in, ask for reboots, online hot-added memory.

One thread owns all state. Watchers only put events on a queue; the loop
waits on that queue with a timeout that is the next deadline (debounce,
periodic rescan, reboot check, watchdog ping), so an idle daemon sleeps.
"""

from __future__ import annotations

import contextlib
import queue
import signal
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

from service.config import Config
from service.daemon import heap
from service.daemon.events import DropWatcher, Event, MemoryWatcher, Queue
from service.daemon.intake_runner import ChildIntake
from service.daemon.notify import notify, watchdog_interval
from service.errors import ServiceError, StateCorrupt
from service.kernel.memory import block_number, online_blocks
from service.kernel.sysfs import Sysfs
from service.layout import Layout
from service.logs import get_logger
from service.reboot import Rebooter, reboot_required
from service.store.publish import ensure_dirs, incoming_dirs, mirror_status
from service.store.state import Phase, load, locked, save
from service.store.statusfile import write_status
from service.window import reboot_due
from stager.manifest import MemoryPolicy
from stager.paths import parse_drop_name
from stager.shown import MAX_REASON, shown

if TYPE_CHECKING:  # not imported at run time: the daemon never loads the verify stack
    from service.store.intake import Intake

log = get_logger("modstage.daemon")
T = TypeVar("T")


class Clock(Protocol):
    """Wall time for windows and records, monotonic time for deadlines."""

    def now(self) -> datetime: ...
    def monotonic(self) -> float: ...


class SystemClock:
    """The real clock."""

    def now(self) -> datetime:
        """Aware current time."""
        return datetime.now(UTC)

    def monotonic(self) -> float:
        """time.monotonic()."""
        return time.monotonic()


@dataclass
class Daemon:
    """The daemon's loop and its decisions; watchers are started by :meth:`serve`."""

    layout: Layout
    config: Config
    intake: Intake | ChildIntake  # serve runs intake in a child process
    rebooter: Rebooter
    clock: Clock = field(default_factory=SystemClock)
    events: Queue = field(default_factory=queue.Queue)
    debounce: float = 0.2
    rescan_every: float = 300.0
    recheck_every: float = 30.0  # while a reboot is wanted but not yet due
    settle: float = 1.0  # metrics wait this long after the last hot-added block
    last_drop: float | None = None  # wall time of the last accepted drop
    watcher: DropWatcher | None = None  # set by serve(); tests may set their own
    more_watchers: list[DropWatcher] = field(default_factory=list)  # other incoming_dirs
    intake_seconds: dict[str, float] = field(default_factory=dict)  # for the metrics
    fed_at: float = float("-inf")  # when the watchdog was last fed
    progress_at: float = 0.0  # last progress of a long step (see feeding())
    unwatched: int = 0  # drop directories beyond the watch cap: polled instead
    poll_unwatched: float = 1.0  # how often, while there are any
    next_beat: float = 0.0  # monotonic time of the next heartbeat

    def heartbeat(self, decision: str | None) -> None:
        """Refresh the heartbeat file (``status`` shows its age) at most every HEARTBEAT_EVERY s."""
        from service.status.glance import HEARTBEAT_EVERY, write_heartbeat

        if self.clock.monotonic() < self.next_beat:
            return
        self.next_beat = self.clock.monotonic() + HEARTBEAT_EVERY
        try:
            at = self.clock.now().timestamp()
            write_heartbeat(self.layout.heartbeat, decision=decision or "error", at=at)
        except OSError as exc:
            log.error("heartbeat.write_failed", path=str(self.layout.heartbeat), error=str(exc))

    def reconcile(self) -> None:
        """Tell a reboot from a restart by the boot id; clear an intent that was fulfilled."""
        current = self.layout.boot_id.read_text().strip()
        with locked(self.layout.var):
            state = load(self.layout.state)
            if state.reboot and state.reboot.get("boot_id") != current:
                save(self.layout.state, replace(state, reboot=None))
                self.rebooter.clear()
                log.info("reboot.happened", asked_at=state.reboot.get("at"))  # once it is saved
            elif state.reboot:
                log.info("daemon.restarted", reboot_intent=state.reboot)

    def take_drops(self) -> list[Any]:
        """Rescan incoming/ and take in every complete drop (watching the drops first)."""
        watchers = [self.watcher] if self.watcher is not None else []
        unwatched = 0
        for watcher in watchers + self.more_watchers:
            try:
                names = {p.name for p in watcher.incoming.iterdir() if parse_drop_name(p.name)}
            except OSError:
                names = set()
            unwatched += watcher.track(names)
        self.unwatched = unwatched
        outcomes = self.intake.run()
        if outcomes:
            heap.trim()  # idle small after reading a bundle
        if any(o.accepted for o in outcomes):
            self.last_drop = self.clock.now().timestamp()
        self.intake_seconds.update(
            {o.bundle: o.seconds for o in outcomes if o.bundle and o.seconds is not None}
        )
        return outcomes

    def maybe_reboot(self) -> str:
        """Ask for a reboot if one is due; record the intent first. Returns the decision."""
        kernel = self.layout.kernel_release()
        current = self.layout.boot_id.read_text().strip()
        with locked(self.layout.var):
            state = load(self.layout.state)
            waiting = reboot_required(state, kernel)
            intent = (
                state.reboot if state.reboot and state.reboot.get("boot_id") == current else None
            )
            due, why = reboot_due(
                self.clock.now(),
                waiting=bool(waiting),
                last_drop=self.last_drop,
                last_request=intent["at"] if intent else None,
                window=self.config.reboot.window,
                guard=self.config.reboot.guard,
            )
            if not due:
                return why
            reason = f"new generation pending for {', '.join(waiting)}"
            record = {
                "at": self.clock.now().timestamp(),
                "boot_id": current,
                "backend": self.rebooter.name,
                "bundles": waiting,
                "reason": reason,
            }
            for name in waiting:
                b = state.bundle(name)
                if b.phase is not Phase.REBOOT_SCHEDULED:
                    note = f"reboot asked via {self.rebooter.name}"
                    if self.rebooter.name == "none":
                        note = "waiting for an admin reboot (backend none)"
                    b = b.move(Phase.REBOOT_SCHEDULED, note=note)
                state = state.with_bundle(name, b)
            save(self.layout.state, replace(state, reboot=record))  # the intent, before acting
            for name in waiting:
                write_status(self.layout, name, state.bundle(name), reboot=record)
            mirror_status(self.layout, self.config)
        log.info("reboot.requested", backend=self.rebooter.name, bundles=waiting)
        self.write_metrics()
        self.rebooter.request(reason)
        return "requested"

    def _guarded(self, step: Callable[[], T]) -> T | None:
        """Run one step of the loop; a service error is logged and the daemon goes on.

        A recorded reboot intent keeps a failing backend from being hammered. A corrupt
        state file is set aside and rebuilt from the last-good pointer and the store at
        once (as boot does), so no later boot finds state.json missing; ``status`` stays
        degraded, naming the set-aside file, until an admin removes it.
        """
        try:
            return step()
        except (ServiceError, OSError) as exc:  # OSError: a full disk, a state.json gone odd
            log.error("daemon.step_failed", step=step.__name__, error=shown(exc, MAX_REASON))
            notify(f"STATUS=error: {shown(exc)}")
            if isinstance(exc, StateCorrupt):
                self._guarded(self.rebuild_state)
            return None

    def feed_watchdog(self) -> None:
        """Progress in a long step (intake calls it per drop and per chunk): we are alive."""
        now = self.clock.monotonic()
        self.progress_at = now
        ping = watchdog_interval()
        if ping and now >= self.fed_at + ping / 2:
            notify("WATCHDOG=1")
            self.fed_at = now

    @contextlib.contextmanager
    def feeding(self) -> Iterator[None]:
        """Keep the watchdog fed during a step while it makes progress.

        A step that cannot call :meth:`feed_watchdog` for a while (parsing a large
        manifest) is covered by a thread that feeds the watchdog as long as the last
        progress is younger than ``limits.max_seconds``: a step stuck longer than a
        drop may take is left to systemd's watchdog, as it should be.
        """
        ping = watchdog_interval()
        if not ping:
            yield
            return
        stop = threading.Event()
        self.progress_at = time.monotonic()
        budget = self.config.limits.max_seconds

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

    def rebuild_state(self) -> None:
        """Rebuild a corrupt (set-aside) state under the lock (see service.store.recover)."""
        from service.store.generations import Store
        from service.store.recover import load_or_rebuild

        with locked(self.layout.var):
            load_or_rebuild(self.layout.state, Store(self.layout.store))

    def write_metrics(self) -> None:
        """Refresh the Prometheus textfile; a failure is logged, never fatal."""
        from service.status.metrics import write_metrics

        try:
            write_metrics(self.layout, self.layout.metrics, verification=self.intake_seconds)
        except OSError as exc:
            log.error("metrics.write_failed", path=str(self.layout.metrics), error=str(exc))

    def _delay_left(self) -> float:
        """Seconds until the minimum delay after the last drop passes, if it has not yet."""
        if self.last_drop is None:
            return self.recheck_every
        left = self.last_drop + self.config.reboot.guard.min_delay - self.clock.now().timestamp()
        return left if left > 0 else self.recheck_every

    def online_memory(self, events: list[Event]) -> list[dict[str, Any]]:
        """Online offline blocks per the host's hotplug policy; log each with its latency."""
        if self.config.hotplug_policy == "kernel":
            return []
        started = min((e.at for e in events), default=self.clock.monotonic())
        added = [block_number(e.detail.removeprefix("add ")) for e in events]
        done = online_blocks(
            Sysfs(self.layout.sys),
            MemoryPolicy(self.config.hotplug_policy),
            since=started,
            clock=self.clock.monotonic,
            only=None if not events or None in added else [n for n in added if n is not None],
        )
        for step in done:
            if "error" in step:
                log.error("memory.online_failed", **step)
            else:
                log.info("memory.onlined", **step)
        return done

    def loop(self) -> None:
        """Run until a stop event: debounce drop events, rescan, check reboots, ping."""
        dirty_at: float | None = self.clock.monotonic()  # rescan on start
        next_rescan = self.clock.monotonic() + self.rescan_every
        ping = watchdog_interval()
        next_ping = self.clock.monotonic()
        next_check: float | None = None  # re-decide a reboot while a generation waits
        metrics_at: float | None = None  # rewrite metrics once hot-added memory settles
        while True:
            now = self.clock.monotonic()
            deadlines = [next_rescan] + ([dirty_at] if dirty_at is not None else [])
            deadlines += [metrics_at] if metrics_at is not None else []
            deadlines += [next_ping] if ping else []
            deadlines += [next_check] if next_check is not None else []
            deadlines.append(self.next_beat)
            batch: list[Event] = []
            try:
                batch.append(self.events.get(timeout=max(0.0, min(deadlines) - now)))
                while True:
                    batch.append(self.events.get_nowait())
            except queue.Empty:
                pass
            if any(e.kind == "stop" for e in batch):
                return
            now = self.clock.monotonic()
            if any(e.kind in ("drop", "overflow") for e in batch):
                dirty_at = now + self.debounce if dirty_at is None else dirty_at
            if any(e.kind == "overflow" for e in batch):
                log.warning("inotify.overflow", action="full rescan")
                dirty_at = now
            memory = [e for e in batch if e.kind == "memory"]
            if memory:
                self.online_memory(memory)
                metrics_at = now + self.settle  # not between the blocks of one DIMM
            elif metrics_at is not None and now >= metrics_at:
                metrics_at = None
                self.write_metrics()
            if now >= next_rescan:
                dirty_at, next_rescan = now, now + self.rescan_every
            scanned = dirty_at is not None and now >= dirty_at
            if scanned:
                dirty_at = None
                with self.feeding():
                    self._guarded(self.take_drops)
                if self.unwatched:  # junk directories spent the watches: poll the rest
                    next_rescan = min(next_rescan, now + self.poll_unwatched)
                self.write_metrics()
                notify(f"STATUS=idle, last scan {self.clock.now().isoformat(timespec='seconds')}")
            memory_only = bool(batch) and len(memory) == len(batch) and not scanned
            quiet = next_check is None or now < next_check
            if memory_only and quiet and now < self.next_beat:
                pass  # hot-added memory changes nothing about reboots: back to listening
            else:
                decision = self._guarded(self.maybe_reboot)
                self.heartbeat(decision)
                if decision in ("requested", "no generation waits for a reboot"):
                    next_check = None
                else:
                    next_check = now + min(self.recheck_every, self._delay_left())
            if ping and now >= next_ping:
                notify("WATCHDOG=1")
                next_ping = now + ping / 2  # twice per interval: slack for a loaded host

    def serve(self) -> None:
        """Start the watchers (memory first, then enumerate), reconcile, loop, shut down."""
        dirs = incoming_dirs(self.layout, self.config)
        ensure_dirs(dirs)
        memory = MemoryWatcher(self.layout.root / "run/udev", self.events)
        memory.start()
        self.online_memory([])  # blocks that arrived before we started
        watchers = [DropWatcher(d.resolve(), self.events) for d in dirs]
        for w in watchers:
            w.start()
        self.watcher, self.more_watchers = watchers[0], watchers[1:]
        self.intake.tick = self.feed_watchdog
        signal.signal(signal.SIGTERM, lambda *_: self.events.put(Event("stop", "SIGTERM")))
        signal.signal(signal.SIGINT, lambda *_: self.events.put(Event("stop", "SIGINT")))
        self._guarded(self.reconcile)
        notify("READY=1", "STATUS=watching for drops")
        log.info(
            "daemon.ready",
            incoming=[str(d) for d in dirs],
            memory_source=memory.source,
            backend=self.rebooter.name,
        )
        try:
            self.loop()
        finally:
            notify("STOPPING=1")
            for w in watchers:
                w.stop()
            memory.stop()
            log.info("daemon.stopped")

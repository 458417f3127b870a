"""``modstage serve``: notice drops and kernels, take drops in, ask for reboots, online memory.

One thread owns all state. Watchers only put events on a queue; the loop
waits on that queue (through its :class:`~service.daemon.clock.Clock`) with a
timeout that is the next deadline (debounce, periodic rescan, reboot check,
watchdog ping), so an idle daemon sleeps. :meth:`Daemon.step` is one pass.
"""

from __future__ import annotations

import contextlib
import queue
import signal
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol, TypeVar

from service.bundles.records import RebootIntent
from service.bundles.state import State
from service.bundles.statefile import load, locked, read, save
from service.config import Config
from service.daemon import heap
from service.daemon.clock import Clock, SystemClock
from service.daemon.events import Event, Kind, Queue
from service.daemon.intake_runner import prepare
from service.daemon.kernelwatch import KernelWatcher
from service.daemon.notify import notify, watchdog_interval
from service.daemon.timers import Timers
from service.daemon.uevents import UeventListener
from service.daemon.watchdog import Watchdog
from service.daemon.watcher import DropWatcher
from service.errors import ServiceError, StateCorrupt
from service.host.memory import Onlined, block_number, online_blocks
from service.host.nextboot import next_kernel
from service.host.onlining_log import log_onlining
from service.host.running import RunningHost
from service.host.sysfs import Sysfs
from service.intake.outcome import Outcome
from service.layout import Layout
from service.logs import get_logger
from service.publish.announce import announce
from service.publish.bundle_status import write_status
from service.publish.labels import write_labels
from service.publish.operator import ensure_dirs, incoming_dirs, mirror_status
from service.rebooting.backends import admin_reboots
from service.rebooting.gate import gate_for
from service.rebooting.request import Rebooter
from service.rebooting.window import Decision, Why, reboot_due
from stager.schema.manifest import MemoryPolicy
from stager.schema.record import dump
from stager.schema.shown import MAX_REASON, shown

log = get_logger("modstage.daemon")
T = TypeVar("T")


class DropIntake(Protocol):
    """What the loop asks of intake: ``ChildIntake`` in ``serve``, its ``tick`` feeding
    :meth:`Watchdog.feed` (the daemon never imports the verify stack, which the
    in-process ``service.intake.scan.Intake`` of the tests carries)."""

    def run(self) -> list[Outcome]:
        """Take in every complete drop; what became of each."""


@dataclass
class Daemon:
    """The daemon's loop and its decisions; watchers are started by :meth:`serve`."""

    layout: Layout
    config: Config
    intake: DropIntake  # serve runs intake in a child process (ChildIntake)
    rebooter: Rebooter
    clock: Clock = field(default_factory=SystemClock)
    events: Queue = field(default_factory=queue.Queue)
    debounce: float = 0.2
    kernel_debounce: float = 2.0  # a package's files land in a burst: read them once after
    rescan_every: float = 300.0
    recheck_every: float = 30.0  # while a reboot is wanted but not yet due
    settle: float = 1.0  # metrics wait this long after the last hot-added block or device
    last_drop: float | None = None  # wall time of the last accepted drop
    watcher: DropWatcher | None = None  # every incoming directory; set by serve() or a test
    kernel_changes: list[str] = field(default_factory=list)  # paths since the last refresh
    intake_seconds: dict[str, float] = field(default_factory=dict)  # for the metrics
    watchdog: Watchdog = field(default_factory=Watchdog)
    sysfs: Sysfs | None = None  # the kernel's sysfs (a fake in tests); None: layout.sys
    incomplete: int = 0  # drop directories still without their manifest: polled
    poll_incomplete: float = 1.0  # how often, while there are any
    next_beat: float = 0.0  # monotonic time of the next heartbeat
    paused: str | None = "boot window not recorded yet"  # why no drop is taken in; None: taken

    def stopped(self) -> None:
        """The last heartbeat: the daemon stopped (``status`` says so at once, not after the
        heartbeat grows stale); a failure is logged, never fatal."""
        from service.status.glance import STOPPED, write_heartbeat

        try:
            write_heartbeat(
                self.layout.heartbeat, decision=STOPPED, at=self.clock.now().timestamp()
            )
        except OSError as exc:
            log.error("heartbeat.write_failed", path=str(self.layout.heartbeat), error=str(exc))

    def heartbeat(self, decision: Decision | None) -> None:
        """Refresh the heartbeat file (``status`` shows its age) at most every HEARTBEAT_EVERY s.

        The decision is written as ``status`` shows it: its text, ``requested`` when it
        was due (the daemon asked), ``error`` when the step failed before deciding.
        """
        from service.status.glance import HEARTBEAT_EVERY, write_heartbeat

        if self.clock.monotonic() < self.next_beat:
            return
        self.next_beat = self.clock.monotonic() + HEARTBEAT_EVERY
        text = "error" if decision is None else "requested" if decision.due else decision.text()
        try:
            at = self.clock.now().timestamp()
            write_heartbeat(self.layout.heartbeat, decision=text, at=at, paused=self.paused)
        except OSError as exc:
            log.error("heartbeat.write_failed", path=str(self.layout.heartbeat), error=str(exc))

    def reconcile(self) -> None:
        """Tell a reboot from a restart by the boot id; clear an intent that was fulfilled."""
        current = RunningHost.read(self.layout).need_boot_id()
        with locked(self.layout.var):
            state = load(self.layout.state)
            if state.reboot and state.reboot.boot_id != current:
                save(self.layout.state, state.rebooted(current))
                self.rebooter.clear()
                log.info("reboot.happened", asked_at=state.reboot.at)  # once it is saved
            elif state.reboot:
                log.info("daemon.restarted", reboot_intent=dump(state.reboot))

    def close_boot_window(self) -> bool:
        """Close this boot's window for ``modstage boot`` durably, if the record does not
        name this boot already: the daemon runs, so the boot's early moment is over
        (:mod:`service.boot.once`). A boot unit started later in this boot (a package
        upgrade, an admin) then changes nothing. Whether it is closed: every scan checks
        first, takes no drop in while it is not, and the heartbeat says why (``status``)."""
        from service.boot import once

        try:
            found, now = once.close_for_daemon(self.layout, self.clock.now().timestamp())
        except OSError as exc:
            paused: str | None = f"boot window not recorded: {exc}"
            log.error("boot.window_unrecorded", path=str(self.layout.boot_window), error=str(exc))
        else:
            paused = None
            if now:
                log.info("boot.window_closed", by="daemon", boot_id=found.boot_id)
        if paused != self.paused:
            self.paused, self.next_beat = paused, 0.0  # status learns at the next heartbeat
        return paused is None

    def take_drops(self) -> list[Any]:
        """Rescan incoming/ and take in every complete drop (counting the incomplete first:
        no event says when their manifest arrives, so the loop polls while there are any).
        Nothing is taken in while this boot's window is not closed durably."""
        if not self.close_boot_window():
            return []
        self.incomplete = self.watcher.incomplete() if self.watcher is not None else 0
        outcomes = self.intake.run()
        if outcomes:
            heap.trim()  # idle small after reading a bundle
        if any(o.accepted for o in outcomes):
            self.last_drop = self.clock.now().timestamp()
        self.intake_seconds.update(
            {o.bundle: o.seconds for o in outcomes if o.bundle and o.seconds is not None}
        )
        return outcomes

    def announce_kernels(self) -> None:
        """Tell the node labels and the driver pods (``_host.json``) which kernel the next
        boot runs and which bundles have a generation for it."""
        state = read(self.layout.state)  # untouched: setting a corrupt one aside is not ours
        found = next_kernel(self.layout, self.config.kernel.next)
        write_labels(self.layout, self.config.node_labels, state, found.release, self.config)
        announce(self.layout, self.config, state, found)

    def refresh_kernels(self) -> None:
        """A kernel's files changed (the kernel watch): what the periodic scan refreshes but
        taking drops in (a package may be unpacking still): the node labels, ``_host.json``
        and the metrics; the loop's pass decides the reboot (the gate) next."""
        changed, self.kernel_changes = self.kernel_changes, []
        log.info("kernels.changed", paths=changed[:8], more=max(0, len(changed) - 8))
        self._guarded(self.announce_kernels)
        self.write_metrics()

    def maybe_reboot(self) -> Decision:
        """Ask for a reboot if one is due: decide, record the intent (transition, save), ask.

        The intent is saved before the backend is asked, so a crash in between is
        reconciled on start; a recorded intent keeps a failing backend from being hammered.
        """
        running = RunningHost.read(self.layout)
        current, kernel = running.need_boot_id(), running.need_release()
        with locked(self.layout.var):
            state = load(self.layout.state)
            waiting = state.awaiting_reboot(kernel)
            intent = state.intent_in(current)
            decision = reboot_due(
                self.clock.now(),
                waiting=bool(waiting),
                last_drop=self.last_drop,
                last_request=intent.at if intent else None,
                window=self.config.reboot.window,
                guard=self.config.reboot.guard,
            )
            if not decision.due:
                return decision
            now = self.clock.now().timestamp()
            gate = gate_for(self.layout, self.config, state, kernel, now)
            if gate is not None and gate.holds:
                log.info("reboot.held", kernel=gate.kernel, bundles=list(gate.bundles))
                return Decision(Why.HELD, left=gate.left, note=gate.line())
            reason = f"new generation pending for {', '.join(waiting)}"
            intent = RebootIntent(
                self.clock.now().timestamp(), current, self.rebooter.name, tuple(waiting), reason
            )
            state = state.reboot_asked(intent, self._asked_note())
            save(self.layout.state, state)  # the intent, before acting
            self._publish(state, intent)
        log.info("reboot.requested", backend=self.rebooter.name, bundles=waiting)
        self.write_metrics()
        self.rebooter.request(reason)
        return decision

    def _asked_note(self) -> str:
        """The history note of a scheduled reboot: how it will come."""
        if admin_reboots(self.rebooter.name):
            return f"waiting for an admin reboot (backend {self.rebooter.name})"
        return f"reboot asked via {self.rebooter.name}"

    def _publish(self, state: State, intent: RebootIntent) -> None:
        """Show the scheduled reboot in each bundle's status file and its mirrors."""
        for name in intent.bundles:
            write_status(self.layout, name, state.bundle(name), reboot=dump(intent))
        mirror_status(self.layout, self.config)

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

    def rebuild_state(self) -> None:
        """Rebuild a corrupt (set-aside) state under the lock (see service.bundles.recover)."""
        from service.boot.once import boot_ran
        from service.bundles.recover import load_or_rebuild
        from service.generations.store import Store

        with locked(self.layout.var):
            booted = boot_ran(self.layout)  # the corrupt file's boot id, where it is known
            load_or_rebuild(self.layout.state, Store(self.layout.store), boot_id=booted)

    def write_metrics(self) -> None:
        """Refresh the Prometheus textfile; a failure is logged, never fatal."""
        from service.status.metrics import write_metrics

        try:
            write_metrics(self.layout, self.layout.metrics, verification=self.intake_seconds)
        except OSError as exc:
            log.error("metrics.write_failed", path=str(self.layout.metrics), error=str(exc))

    def record_unloads(self, events: list[Event]) -> None:
        """Record when modules left the kernel (and forget those that came back) in
        ``/run/modstage/unloads.json``; a failure is logged, never fatal."""
        from service.status.unloads import read_unloads, updated, write_unloads

        changes = [(action, name) for action, _, name in (e.detail.partition(" ") for e in events)]
        gone = [name for action, name in changes if action == "remove"]
        if gone:
            log.info("modules.unloaded", modules=gone)
        try:
            boot_id = RunningHost.read(self.layout).need_boot_id()
            before = read_unloads(self.layout.unloads, boot_id)
            after = updated(before, changes, self.clock.now().timestamp())
            if after != before:
                write_unloads(self.layout.unloads, boot_id, after)
        except OSError as exc:
            log.error("unloads.write_failed", path=str(self.layout.unloads), error=str(exc))

    def online_memory(self, events: list[Event]) -> list[Onlined]:
        """Online offline blocks per the host's hotplug policy; log each with its latency."""
        if self.config.hotplug_policy == "kernel":
            return []
        started = min((e.at for e in events), default=self.clock.monotonic())
        added = [block_number(e.detail.removeprefix("add ")) for e in events]
        done = online_blocks(
            self.sysfs or Sysfs(self.layout.sys),
            MemoryPolicy(self.config.hotplug_policy),
            since=started,
            clock=self.clock.monotonic,
            only=None if not events or None in added else [n for n in added if n is not None],
        )
        log_onlining(done)
        return done

    def loop(self) -> None:
        """Run until a stop event: wait for events or the next deadline, then one :meth:`step`."""
        timers = Timers.start(self.clock.monotonic(), self.rescan_every, watchdog_interval())
        while True:
            batch = self.next_batch(timers.earliest(self.next_beat) - self.clock.monotonic())
            if any(e.kind is Kind.STOP for e in batch):
                return
            self.step(batch, timers)

    def next_batch(self, timeout: float) -> list[Event]:
        """Wait up to ``timeout`` seconds for an event, then take every event queued with it."""
        first = self.clock.wait(self.events, max(0.0, timeout))
        batch = [] if first is None else [first]
        with contextlib.suppress(queue.Empty):
            while first is not None:
                batch.append(self.events.get_nowait())
        return batch

    def step(self, batch: list[Event], timers: Timers) -> None:
        """One pass: debounce drops, online memory, scan when due, decide reboots, ping."""
        now = self.clock.monotonic()
        hook = [e.detail for e in batch if e.kind is Kind.KERNEL_HOOK]
        if hook:  # the package's files are in place: a full scan (waiting drops too)
            log.info("kernels.hook", files=sorted(set(hook)))
        kernel_files = [e.detail for e in batch if e.kind is Kind.KERNEL]
        if kernel_files:
            self.kernel_changes += kernel_files
            timers.kernel = now + self.kernel_debounce if timers.kernel is None else timers.kernel
        if any(e.kind in (Kind.DROP, Kind.OVERFLOW, Kind.KERNEL_HOOK) for e in batch):
            timers.dirty = now + self.debounce if timers.dirty is None else timers.dirty
            prepare(self.intake)  # a child intake starts during the debounce
        if any(e.kind is Kind.OVERFLOW for e in batch):
            log.warning("inotify.overflow", action="full rescan")
            timers.dirty = now
        memory = [e for e in batch if e.kind is Kind.MEMORY]
        devices = [e for e in batch if e.kind is Kind.DEVICES]
        modules = [e for e in batch if e.kind is Kind.MODULES]
        if memory:
            self.online_memory(memory)
        if devices:
            log.info("devices.changed", uevents=[e.detail for e in devices])
        if modules:
            self.record_unloads(modules)
        if memory or devices or modules:  # the metrics read the blocks and devices again
            timers.metrics = now + self.settle  # not between the blocks of one DIMM
        elif timers.metrics is not None and now >= timers.metrics:
            timers.metrics = None
            self.write_metrics()
        scanned = self._scan_if_due(timers, now)
        if scanned:
            timers.kernel = None  # the scan announced the kernels already
            self.kernel_changes.clear()
        elif timers.kernel is not None and now >= timers.kernel:
            timers.kernel = None
            self.refresh_kernels()
        kernel_only = len(memory) + len(devices) + len(modules) == len(batch)
        hardware_only = bool(batch) and kernel_only and not scanned
        quiet = timers.check is None or now < timers.check
        if not (hardware_only and quiet and now < self.next_beat):
            self._decide(timers, now)  # memory and devices alone change nothing about reboots
        if timers.ping is not None and now >= timers.ping:
            notify("WATCHDOG=1")
            timers.ping = now + timers.ping_every  # twice per interval: slack for a loaded host

    def _scan_if_due(self, timers: Timers, now: float) -> bool:
        """Take drops in when the debounce or the periodic rescan is due; whether it scanned."""
        if now >= timers.rescan:
            timers.dirty, timers.rescan = now, now + self.rescan_every
        if timers.dirty is None or now < timers.dirty:
            return False
        timers.dirty = None
        with self.watchdog.feeding(self.config.limits.max_seconds):
            self._guarded(self.take_drops)
        self._guarded(self.announce_kernels)  # a kernel installed or removed since
        if self.incomplete:  # a manifest may arrive with no event: poll until it did
            timers.rescan = min(timers.rescan, now + self.poll_incomplete)
        self.write_metrics()
        notify(f"STATUS=idle, last scan {self.clock.now().isoformat(timespec='seconds')}")
        return True

    def _decide(self, timers: Timers, now: float) -> None:
        """Decide (and maybe ask for) a reboot; re-check while time alone may change it."""
        decision = self._guarded(self.maybe_reboot)
        self.heartbeat(decision)
        after = self.recheck_every if decision is None else decision.recheck(self.recheck_every)
        timers.check = None if after is None else now + after

    def serve(self) -> None:
        """Start the watchers (memory first, then enumerate), reconcile, loop, shut down."""
        dirs = incoming_dirs(self.layout, self.config)
        ensure_dirs(dirs)
        uevents = UeventListener(Sysfs(self.layout.sys), self.config.hotplug_policy, self.events)
        uevents.start()
        self.online_memory([])  # blocks that arrived before we started
        self.watcher = DropWatcher([d.resolve() for d in dirs], self.events)
        self.watcher.start()
        kernels = KernelWatcher(self.layout, self.events)
        kernels.start()
        signal.signal(signal.SIGTERM, lambda *_: self.events.put(Event(Kind.STOP, "SIGTERM")))
        signal.signal(signal.SIGINT, lambda *_: self.events.put(Event(Kind.STOP, "SIGINT")))
        self._guarded(self.close_boot_window)
        self._guarded(self.reconcile)
        notify("READY=1", "STATUS=watching for drops")
        log.info(
            "daemon.ready",
            incoming=[str(d) for d in dirs],
            memory_source=uevents.source_name,
            backend=self.rebooter.name,
        )
        try:
            self.loop()
        finally:
            notify("STOPPING=1")
            self.watcher.stop()
            kernels.stop()
            uevents.stop()
            self.stopped()
            log.info("daemon.stopped")

"""``modstage boot``: the oneshot run early at boot (see deploy/systemd).

Under ``--root`` other than ``/`` (a sandbox) the kernel is a
:class:`~service.host.recording.RecordingKernel`: the loader runs in full on the
files under the root, and the ``finit_module`` calls it would have made are printed
instead of made. ``--dry-run`` runs the same boot, from the same host (``config.toml``
salvaged, each problem logged as ``config.invalid``), with every effect recorded and
prints it: nothing changes. Every line a dry run prints starts ``preview:`` and every
line it logs carries ``preview=true``, so no line of it reads as the boot's own.

A boot acts once per boot (:mod:`service.boot.once`): run again in a boot whose loads
already happened, or after the daemon started in it, it changes nothing, says so and
exits 0; ``--force-live-load`` is the admin's explicit, loud override.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, TextIO

from service.bundles.phase import Phase
from service.cmd.host import Host
from service.host.running import RunningHost
from service.layout import Layout

if TYPE_CHECKING:
    import argparse

    from service.boot.once import Closed
    from service.bundles.state import State


def host_for(layout: Layout, running: RunningHost | None = None) -> Host:
    """The host a boot and its dry run decide with: ``config.toml`` salvaged (a typo must
    never load less), each problem logged once as ``config.invalid``; ``running``: the
    host's facts as the command read them (None: read when first needed)."""
    from service.boot.loader import log

    host = Host(layout, salvage=True, running=running)
    if host.config_problems:
        log.error("config.invalid", path=str(layout.config), problems=list(host.config_problems))
    return host


def exit_code(state: State) -> int:
    """1 if any bundle ended failed or without a generation for the running kernel (a
    bundle that had a driver has none), else 0 (a boot's and its dry run's)."""
    missing = (Phase.FAILED, Phase.OTHER_KERNEL)
    return 1 if any(b.phase in missing for b in state.bundles.values()) else 0


def dry_run(layout: Layout, out: TextIO, running: RunningHost | None = None) -> int:
    """Print what the next boot would do, each line a preview; exit as the boot would.
    ``running``: the host's facts as the command read them (None: read here)."""
    from dataclasses import replace

    from service.boot.dryrun import dry_run as run_dry
    from service.boot.dryrun import render
    from service.cmd.host import identify
    from service.logs import preview

    with preview():
        host = host_for(layout, running)
        done = run_dry(layout, host.config, lambda: host.trust, identify, host.running)
        retired: list[tuple[str, ...]] = []
        retire_metrics(layout, recorded=retired)
        done = replace(done, events=(*done.events, *retired))
        render(done, layout, out)
    return exit_code(done.state)


def run(args: argparse.Namespace, out: TextIO) -> int:
    """Load every bundle; exit 1 if any bundle ended failed or has no generation for the
    running kernel."""
    layout = Layout(args.root)
    running = RunningHost.read(layout)  # once: the boot id, the kernel, sandbox or not
    if getattr(args, "dry_run", False):
        return dry_run(layout, out, running)
    from service.boot.loader import Boot, summary

    force = getattr(args, "force_live_load", False)
    if not once_per_boot(layout, out, force=force, running=running):
        return 0
    host = host_for(layout, running)
    kernel = host.kernel
    boot = Boot(layout, host.config, lambda: host.trust, kernel, running=running)
    state = boot.run()  # the certificates read if a module is verified
    for call in getattr(kernel, "calls", ()):
        print(f"sandbox {layout.root}: not called: {' '.join(filter(None, call))}", file=out)
    for line in summary(state, boot.release):
        print(line, file=out)
    if host.config.lock_modules:
        print(lock_modules(layout), file=out)
    retire_metrics(layout)
    return exit_code(state)


def lock_modules(layout: Layout) -> str:
    """``[lock_modules]``: write 1 to ``kernel.modules_disabled`` once every bundle had its
    turn, so nothing loads a module until the next reboot; the line to print. A write that
    fails is logged and said: the boot goes on (the bundles are up)."""
    from service.boot.loader import log

    try:
        layout.modules_disabled.write_text("1\n")
    except OSError as exc:
        log.error("modules.lock_failed", path=str(layout.modules_disabled), error=str(exc))
        return f"modules: NOT locked: {layout.modules_disabled}: {exc.strerror or exc}"
    log.info("modules.locked", path=str(layout.modules_disabled))
    return "modules: locked until the next reboot (kernel.modules_disabled = 1, lock_modules)"


def once_per_boot(
    layout: Layout, out: TextIO, *, force: bool, running: RunningHost | None = None
) -> bool:
    """Whether this run may act: close this boot's window and say True, or, if it was
    closed already and ``force`` is not given, say why nothing is done and return False.
    The check and the record are made under the state lock (a daemon closing the window
    at the same moment waits for it); a boot id that cannot be read raises (nothing loads).

    A record that cannot be written is logged and the boot goes on (``state.json``'s boot
    id, saved with the boot's first transition, still tells a second run, and the daemon
    writes the record down before it takes anything in); refusing would boot the node
    without its driver.
    """
    from service.boot import once
    from service.bundles.statefile import locked

    running = running if running is not None else RunningHost.read(layout)
    boot_id = running.need_boot_id()
    with locked(layout.var):
        before = once.closed(layout, boot_id)
        if before is None or force:
            _close(layout, boot_id)
    if before is not None:
        _say_closed(before, out, force=force)
    return before is None or force


def _close(layout: Layout, boot_id: str) -> None:
    """Record that the boot closes this boot's window; a failure is logged, not fatal."""
    import time

    from service.boot import once
    from service.boot.loader import log

    try:
        once.close(layout, boot_id, once.BOOT, time.time())
    except OSError as exc:
        log.error("boot.window_unrecorded", path=str(layout.boot_window), error=str(exc))


def _say_closed(before: Closed, out: TextIO, *, force: bool) -> None:
    """Log and print that this boot's window was closed already (and whether forced)."""
    from service.boot.loader import log

    if not force:
        log.warning("boot.already_done", boot_id=before.boot_id, by=before.by, at=before.at)
        print(
            f"modstage boot: nothing done: {before.sentence()}. Loading now would load or "
            "unload modules in the running system; pending generations load at the next "
            "boot (--force-live-load runs anyway)",
            file=out,
        )
        return
    log.warning("boot.forced_live", boot_id=before.boot_id, by=before.by, at=before.at)
    print(
        f"modstage boot: --force-live-load: {before.sentence()}; loading into the running system",
        file=out,
    )


def retire_metrics(layout: Layout, *, recorded: list[tuple[str, ...]] | None = None) -> None:
    """Remove the node-exporter textfile the previous boot's daemon left (a dry run:
    append ``("remove", path)`` to ``recorded`` if there is one, and remove nothing).

    It describes a boot that is over; the daemon writes the new one on its first pass,
    right after it starts (it is ordered after this unit), so until then the metrics are
    absent rather than stale, and a node whose daemon does not start shows no
    ``modstage_*`` series at all (an ``absent()`` alert) instead of the old phases. The
    status collection behind the metrics is the daemon's work, not the boot's.
    """
    from service.boot.loader import log

    if recorded is not None:
        if layout.metrics.exists():
            recorded.append(("remove", str(layout.metrics)))
        return
    try:
        layout.metrics.unlink(missing_ok=True)
    except OSError as exc:  # metrics must never fail a boot
        log.error("metrics.retire_failed", path=str(layout.metrics), error=exc.strerror or str(exc))

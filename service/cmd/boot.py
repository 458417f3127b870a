"""``modstage boot``: the oneshot run early at boot (see deploy/systemd).

Under ``--root`` other than ``/`` (a sandbox) the kernel is a
:class:`~service.kernel.recording.RecordingKernel`: the loader runs in full on the
files under the root, and the ``finit_module`` calls it would have made are printed
instead of made. ``--dry-run`` runs the same boot, from the same host (``config.toml``
salvaged, each problem logged as ``config.invalid``), with every effect recorded and
prints it: nothing changes. Every line a dry run prints starts ``preview:`` and every
line it logs carries ``preview=true``, so no line of it reads as the boot's own.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, TextIO

from service.cmd.host import Host
from service.layout import Layout
from service.store.phase import Phase

if TYPE_CHECKING:
    import argparse

    from service.store.state import State


def host_for(layout: Layout) -> Host:
    """The host a boot and its dry run decide with: ``config.toml`` salvaged (a typo must
    never load less), each problem logged once as ``config.invalid``."""
    from service.boot.loader import log

    host = Host(layout, salvage=True)
    if host.config_problems:
        log.error("config.invalid", path=str(layout.config), problems=list(host.config_problems))
    return host


def exit_code(state: State) -> int:
    """1 if any bundle ended failed, else 0 (a boot's and its dry run's)."""
    return 1 if any(b.phase is Phase.FAILED for b in state.bundles.values()) else 0


def dry_run(layout: Layout, out: TextIO) -> int:
    """Print what the next boot would do, each line a preview; exit as the boot would."""
    from dataclasses import replace

    from service.boot.dryrun import dry_run as run_dry
    from service.boot.dryrun import render
    from service.cmd.host import identify
    from service.logs import preview

    with preview():
        host = host_for(layout)
        done = run_dry(layout, host.config, lambda: host.trust, identify)
        retired: list[tuple[str, ...]] = []
        retire_metrics(layout, recorded=retired)
        done = replace(done, events=(*done.events, *retired))
        render(done, layout, out)
    return exit_code(done.state)


def run(args: argparse.Namespace, out: TextIO) -> int:
    """Load every bundle; exit 1 if any bundle ended failed."""
    layout = Layout(args.root)
    if getattr(args, "dry_run", False):
        return dry_run(layout, out)
    from service.boot.loader import Boot, summary

    host = host_for(layout)
    kernel = host.kernel
    state = Boot(layout, host.config, lambda: host.trust, kernel).run()  # read if used
    for call in getattr(kernel, "calls", ()):
        print(f"sandbox {layout.root}: not called: {' '.join(filter(None, call))}", file=out)
    for line in summary(state):
        print(line, file=out)
    retire_metrics(layout)
    return exit_code(state)


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

"""``modstage boot``: the oneshot run early at boot (see deploy/systemd).

Under ``--root`` other than ``/`` (a sandbox) the kernel is a
:class:`~service.kernel.recording.RecordingKernel`: the loader runs in full on the
files under the root, and the ``finit_module`` calls it would have made are printed
instead of made. ``--dry-run`` runs the same boot with every effect recorded and prints
it: nothing changes.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, TextIO

from service.cmd.host import Host
from service.layout import Layout
from service.store.phase import Phase

if TYPE_CHECKING:
    import argparse


def dry_run(layout: Layout, out: TextIO) -> int:
    """Print what the next boot would do; exit 1 if a bundle would end failed."""
    from service.boot.dryrun import dry_run as run_dry
    from service.boot.dryrun import render
    from service.cmd.host import identify

    host = Host(layout)
    done = run_dry(layout, host.config, lambda: host.trust, identify)
    render(done, layout, out)
    return 1 if done.failed else 0


def run(args: argparse.Namespace, out: TextIO) -> int:
    """Load every bundle; exit 1 if any bundle ended failed."""
    layout = Layout(args.root)
    if getattr(args, "dry_run", False):
        return dry_run(layout, out)
    from service.boot.loader import Boot, log

    host = Host(layout, salvage=True)  # a typo must never load less
    if host.config_problems:
        log.error("config.invalid", path=str(layout.config), problems=list(host.config_problems))
    kernel = host.kernel
    state = Boot(layout, host.config, lambda: host.trust, kernel).run()  # read if used
    for call in getattr(kernel, "calls", ()):
        print(f"sandbox {layout.root}: not called: {' '.join(filter(None, call))}", file=out)
    for name, b in sorted(state.bundles.items()):
        print(
            f"{name}: {b.phase.value} (active {b.active or '-'}, pending {b.pending or '-'})",
            file=out,
        )
    retire_metrics(layout)
    return 0 if all(b.phase is not Phase.FAILED for b in state.bundles.values()) else 1


def retire_metrics(layout: Layout) -> None:
    """Remove the node-exporter textfile the previous boot's daemon left.

    It describes a boot that is over; the daemon writes the new one on its first pass,
    right after it starts (it is ordered after this unit), so until then the metrics are
    absent rather than stale, and a node whose daemon does not start shows no
    ``modstage_*`` series at all (an ``absent()`` alert) instead of the old phases. The
    status collection behind the metrics is the daemon's work, not the boot's.
    """
    from service.boot.loader import log

    try:
        layout.metrics.unlink(missing_ok=True)
    except OSError as exc:  # metrics must never fail a boot
        log.error("metrics.retire_failed", path=str(layout.metrics), error=exc.strerror or str(exc))

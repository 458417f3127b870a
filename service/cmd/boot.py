"""``modstage boot``: the oneshot run early at boot (see deploy/systemd).

Under ``--root`` other than ``/`` (a sandbox) the kernel is a
:class:`~service.kernel.recording.RecordingKernel`: the loader runs in full on the
files under the root, and the ``finit_module`` calls it would have made are printed
instead of made. ``--dry-run`` runs the same boot with every effect recorded and prints
it: nothing changes.
"""

from __future__ import annotations

import os
import sys
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
    from service.logs import configure

    configure()
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
    metrics_in_background(layout, out)
    return 0 if all(b.phase is not Phase.FAILED for b in state.bundles.values()) else 1


def write_boot_metrics(layout: Layout) -> None:
    """The node-exporter textfile after a boot; a failure is logged, never raised."""
    from service.boot.loader import log
    from service.status.metrics import write_metrics  # the status collection: not boot's

    try:
        write_metrics(layout, layout.metrics)
    except OSError as exc:  # metrics must never fail a boot
        log.error("metrics.write_failed", path=str(layout.metrics), error=exc.strerror or str(exc))


#: Metrics writers a long-lived caller (the tests) forked and has not reaped yet.
_writers: list[int] = []


def metrics_in_background(layout: Layout, out: TextIO) -> None:
    """Write the metrics textfile in a child once the boot's outcome is final.

    systemd starts the kubelet when this process exits; the status collection behind
    the metrics (a fifth of a boot's time) need not delay it, nor need the boot wait
    for the child: the console script exits at once (``service.cli.entry``) and the
    child, reparented to init, is reaped there. A caller that lives on reaps its earlier
    writers here, once they are done. Without ``fork`` the file is written here.
    """
    for pid in list(_writers):
        try:
            if os.waitpid(pid, os.WNOHANG)[0] == 0:
                continue  # still writing
        except ChildProcessError:
            pass  # reaped by someone else
        _writers.remove(pid)
    for stream in (out, sys.stdout, sys.stderr):
        stream.flush()
    try:
        child = os.fork()
    except OSError:
        write_boot_metrics(layout)
        return
    if child:
        _writers.append(child)
        return
    try:  # the child: never returns into the caller's code
        write_boot_metrics(layout)
    except BaseException:
        import traceback

        traceback.print_exc()
    finally:
        sys.stderr.flush()
        os._exit(0)

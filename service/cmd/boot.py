"""``modstage boot``: the oneshot run early at boot (see deploy/systemd)."""

from __future__ import annotations

import argparse
from typing import TextIO

from service.boot.loader import Boot, log
from service.config import Config
from service.kernel.modules import LinuxKernel
from service.layout import Layout
from service.logs import configure
from service.store.state import Phase
from service.verify.trust import TrustStore


def run(args: argparse.Namespace, out: TextIO) -> int:
    """Load every bundle; exit 1 if any bundle ended failed."""
    configure()
    layout = Layout(args.root)
    config, problems = Config.salvage(layout.config)  # a typo must never load less
    if problems:
        log.error("config.invalid", path=str(layout.config), problems=list(problems))
    state = Boot(
        layout,
        config,
        TrustStore.from_directory(layout.trusted),
        LinuxKernel(layout.sys),
    ).run()
    from service.status.metrics import write_metrics  # after loading: off the critical path

    try:
        write_metrics(layout, layout.metrics)
    except OSError as exc:  # metrics must never fail a boot
        log.error("metrics.write_failed", path=str(layout.metrics), error=exc.strerror or str(exc))
    for name, b in sorted(state.bundles.items()):
        print(
            f"{name}: {b.phase.value} (active {b.active or '-'}, pending {b.pending or '-'})",
            file=out,
        )
    return 0 if all(b.phase is not Phase.FAILED for b in state.bundles.values()) else 1

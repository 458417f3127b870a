"""``modstage intake``: take complete drops into the store as pending generations."""

from __future__ import annotations

import argparse
from typing import TextIO

from service.config import Config
from service.layout import Layout
from service.logs import configure
from service.store.intake import Intake
from service.verify.keyring import KernelKeyring
from service.verify.trust import TrustStore


def build(layout: Layout) -> Intake:
    """An :class:`Intake` for the host at ``layout`` (the daemon builds the same)."""
    return Intake(
        layout=layout,
        config=Config.load(layout.config),
        trust=TrustStore.from_directory(layout.trusted),
        keyring=KernelKeyring(layout.proc),
    )


def run(args: argparse.Namespace, out: TextIO) -> int:
    """Take in the given drops (or all); exit 1 if any was rejected."""
    configure()
    layout = Layout(args.root)
    outcomes = build(layout).run([d.absolute() for d in args.drops] or None)
    for o in outcomes:
        if o.accepted:
            print(f"{o.drop.name}: pending {o.bundle} generation {o.generation}", file=out)
        elif o.deferred:
            print(f"{o.drop.name}: deferred (drop kept): {'; '.join(o.reasons)}", file=out)
        else:
            print(f"{o.drop.name}: rejected: {'; '.join(o.reasons)}", file=out)
    return 0 if all(o.accepted for o in outcomes) else 1

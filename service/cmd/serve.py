"""``modstage serve``: the host daemon (see :mod:`service.daemon.loop`)."""

from __future__ import annotations

import argparse
from typing import TextIO

from service.daemon.loop import Daemon
from service.layout import Layout
from service.reboot import rebooter


def run(args: argparse.Namespace, out: TextIO) -> int:
    """``modstage serve``."""
    from service.config import Config
    from service.daemon.intake_runner import ChildIntake
    from service.logs import configure

    configure()
    layout = Layout(args.root)
    intake = ChildIntake(layout, Config.load(layout.config))  # verification in a child
    Daemon(layout, intake.config, intake, rebooter(intake.config.reboot, layout)).serve()
    return 0

"""``modstage serve``: the host daemon (see :mod:`service.daemon.loop`)."""

from __future__ import annotations

import argparse
from typing import TextIO

from service.cmd.host import Host
from service.daemon.intake_runner import ChildIntake
from service.daemon.loop import Daemon
from service.layout import Layout


def run(args: argparse.Namespace, out: TextIO) -> int:
    """``modstage serve``."""
    host = Host(Layout(args.root))
    intake = ChildIntake(host.layout, host.config)  # verification in a child process
    Daemon(host.layout, host.config, intake, host.rebooter).serve()
    return 0

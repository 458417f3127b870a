"""``modstage serve``: the host daemon (see :mod:`service.daemon.loop`).

Built from the config and the reboot backend alone, not through
:class:`~service.cmd.host.Host` (which reaches the verify stack): the daemon never imports
``service.verify``; intake runs in a child process (``lint-imports`` holds both to it).
"""

from __future__ import annotations

import argparse
from typing import TextIO

from service.config import Config
from service.daemon.intake_runner import ChildIntake
from service.daemon.loop import Daemon
from service.layout import Layout
from service.rebooting.request import rebooter


def run(args: argparse.Namespace, out: TextIO) -> int:
    """``modstage serve``."""
    layout = Layout(args.root)
    config = Config.load(layout.config)
    intake = ChildIntake(layout, config)  # verification in a child process
    daemon = Daemon(layout, config, intake, rebooter(config.reboot, layout, config.kernel.next))
    intake.tick = daemon.watchdog.feed  # each progress line of the child feeds systemd's
    daemon.serve()
    return 0

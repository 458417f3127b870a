"""``modstage status``: the host's status, as text, as JSON, or as kured's sentinel answer."""

from __future__ import annotations

import argparse
import json
import sys
from typing import TextIO

from service.layout import Layout
from service.status import required
from service.status.collect import collect
from service.status.view import render


def run(args: argparse.Namespace, out: TextIO) -> int:
    """``modstage status``: print the status; exit 0 healthy, 1 degraded, 2 failed.

    With ``--reboot-required`` (kured's sentinel command): exit 0, 1, or 3 on any error.
    """
    layout = Layout(args.root)
    if args.reboot_required:
        return required.run(layout, out, sys.stderr)
    report = collect(layout)
    if args.json:
        print(json.dumps(report.to_json(), indent=2, sort_keys=True), file=out)
    else:
        render(report, out, issuers=args.issuers)
    return report.exit_code

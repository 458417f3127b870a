"""``modstage verify`` with every file judged alone, as the oracle's guest loads each case
alone (the verb judges files named together as one bundle): the verb's own parser, target,
trust and ``--json`` output, only the bundling left out.

``python -m tests.oracle.verify_apart [verify's options] PATH...``
"""

from __future__ import annotations

import sys

from service.cmd.verify import run
from service.parser import build_parser


def main(argv: list[str]) -> int:
    """Run ``modstage verify`` over ``argv`` with ``apart`` set; its exit code."""
    args = build_parser("verify").parse_args(["verify", *argv])
    args.apart = True
    return run(args, sys.stdout)


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))

"""Run ``Boot`` on a host tree with the recording fake kernel: the crash tests' boot process.

The host is built by :class:`~service.cmd.host.Host`, as ``modstage boot`` builds it.

``python -m tests.hardening.boot_runner ROOT [--fail MODULE]``: exit 0 when no bundle
ended failed, 1 otherwise; the kernel calls are printed as JSON.
"""

from __future__ import annotations

import argparse
import errno
import json
import sys
from pathlib import Path

from service.boot.loader import Boot
from service.bundles.phase import Phase
from service.cmd.host import Host
from service.layout import Layout
from tests.service.fakes import FakeKernel


def main(argv: list[str]) -> int:
    """Boot once; ``--fail NAME`` makes the fake kernel refuse that module with ENODEV."""
    parser = argparse.ArgumentParser()
    parser.add_argument("root", type=Path)
    parser.add_argument("--fail", action="append", default=[])
    args = parser.parse_args(argv)
    kernel = FakeKernel(fail=dict.fromkeys(args.fail, errno.ENODEV))
    host = Host(Layout(args.root), kernel, salvage=True)  # as modstage boot builds it
    state = Boot(host.layout, host.config, host.trust, host.kernel).run()
    print(json.dumps(kernel.calls))
    return 0 if all(b.phase is not Phase.FAILED for b in state.bundles.values()) else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

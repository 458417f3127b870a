"""An interactive shell in the test VM: `python -m tests.vm.shell [--kernel 6.12] [--state DIR]
[KERNEL_ARG...]`.

Boots the same guest the tests use (Debian 12's 6.1 on the host's root, or with `--kernel 6.12`
Debian 13's kernel on its Debian 13 root; the host's root read-only with a tmpfs
overlay, DIR or a temporary directory as /var/lib/modstage) but runs bash on the serial console
instead of the agent. `exit` powers the guest off; Ctrl-A x kills qemu.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
from dataclasses import replace
from pathlib import Path

from tests.vm.harness import Vm
from tests.vm.harness.kernel import SERIES, Kernel


def main(argv: list[str] | None = None) -> int:
    """Boot a guest with a shell on the console; returns qemu's exit status."""
    parser = argparse.ArgumentParser(prog="python -m tests.vm.shell", description=__doc__)
    parser.add_argument("--state", type=Path, help="host directory shared as /var/lib/modstage")
    parser.add_argument("--memory", default="1G,slots=4,maxmem=4G", help="qemu -m value")
    parser.add_argument("--kernel", choices=SERIES, default="6.1", help="kernel series to boot")
    parser.add_argument("kernel_args", nargs="*", help="extra kernel arguments")
    args = parser.parse_args(argv)
    state = args.state or Path(tempfile.mkdtemp(prefix="modstage-vm-state-"))
    kernel = Kernel.named(args.kernel)
    with (
        Vm(
            state, name="shell", kernel_args=args.kernel_args, memory=args.memory, kernel=kernel
        ) as vm,
        tempfile.TemporaryDirectory(prefix="msvm-") as sockets,
    ):
        machine = replace(vm.machine, shell=True)
        print(f"state share: {vm.state_dir} -> /var/lib/modstage; QMP: {sockets}/qmp.sock")
        return subprocess.run(machine.argv(Path(sockets)), check=False).returncode


if __name__ == "__main__":
    sys.exit(main())

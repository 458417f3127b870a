"""A modstage node in the test VM: the host's trust and config per boot, modstage commands.

The guest's /etc is a tmpfs overlay, lost at every reboot, like an immutable host image that
carries its certificates; :func:`prepare` puts them back after each boot. The state share
(/var/lib/modstage) persists, as the node's persistent ephemeral volume does.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from service.bundles.state import State
from stager.drop import ModuleSpec, stage
from tests.vm.harness import Vm

#: the host config of a node under the GPU operator: the driver pod's incoming and status
#: directories, its digest file, an admin's reboot without delay
OPERATOR_CONFIG = """\
incoming_dirs = ["/var/lib/modstage/incoming", "/run/nvidia/modstage/incoming"]
[publish]
status_dirs = ["/run/nvidia/modstage/status"]
digest_files = { nvidia = "/run/nvidia/nvidia-driver.state" }
[reboot]
backend = "none"
min_delay = 0
"""


def prepare(vm: Vm, certificates: dict[str, bytes], config: str = "") -> None:
    """Install trusted certificates and config.toml in the guest's /etc/modstage."""
    vm.python("import os; os.makedirs('/etc/modstage/trusted.d', exist_ok=True)")
    for name, data in certificates.items():
        vm.python(f"open('/etc/modstage/trusted.d/{name}', 'wb').write({data!r})")
    vm.python(f"open('/etc/modstage/config.toml', 'w').write({config!r})")


def modstage(vm: Vm, *argv: str, timeout: float = 120, replay_boot: bool = True) -> tuple[int, str]:
    """Run ``modstage ARGV`` inside the guest's long-lived Python; (exit code, output).

    Most tests play a reboot in place: ``modstage boot`` run again in the same guest boot,
    which modstage refuses (once per boot) unless told ``--force-live-load``; so a ``boot``
    (not ``--dry-run``) gets that flag unless ``replay_boot`` is False. The tests of the
    once-per-boot guard itself (tests/vm/test_deb_systemd.py) reboot for real."""
    if replay_boot and argv[:1] == ("boot",) and "--dry-run" not in argv:
        argv = (*argv, "--force-live-load")
    out = vm.python(
        "import io, sys\n"
        "from service.cli import main\n"
        "_buf = io.StringIO()\n"
        f"_rc = main({list(argv)!r}, _buf)\n"
        "print(_rc)\nprint(_buf.getvalue(), end='')\n",
        timeout=timeout,
    )
    rc, _, text = out.partition("\n")
    return int(rc), text


def drop(
    vm: Vm, bundle: str, version: str, kernel: str, modules: list[tuple[Path, str]], **options: Any
) -> Path:
    """Stage a bundle onto the node's incoming directory, as a driver container would."""
    incoming = vm.state_dir / "incoming"
    incoming.mkdir(exist_ok=True)
    return stage(
        incoming,
        bundle=bundle,
        version=version,
        kernel=kernel,
        modules=[ModuleSpec(p, params) for p, params in modules],
        **options,
    )


def state(vm: Vm) -> State:
    """The node's state.json, read on the host side of the share."""
    from service.bundles.statefile import load

    return load(vm.state_dir / "state.json")


def status(vm: Vm, bundle: str) -> dict[str, Any]:
    """The bundle's status file as the container would read it."""
    return dict(json.loads((vm.state_dir / "status" / f"{bundle}.json").read_text()))


def live_modules(vm: Vm) -> list[str]:
    """Modules live in the guest, in /proc/modules order (newest first)."""
    return [line.split()[0] for line in vm.read("/proc/modules").splitlines()]


def start_daemon(vm: Vm, log: str) -> Path:
    """Start ``modstage serve`` in the guest, logging to ``log`` on the state share.

    Returns the host path of the log (JSON lines: stdout is not a terminal).
    """
    vm.python(
        "import subprocess, sys\n"
        "daemon = subprocess.Popen([sys.executable, '-m', 'service.cli', 'serve'],"
        f" stdout=open('/var/lib/modstage/{log}', 'w'), stderr=subprocess.STDOUT)"
    )
    return vm.state_dir / log


def daemon_events(log: Path) -> list[dict[str, Any]]:
    """The daemon's log events so far."""
    lines = log.read_text().splitlines() if log.exists() else []
    return [json.loads(line) for line in lines if line.startswith("{")]


def wait_until(predicate: Callable[[], object], timeout: float, what: str) -> None:
    """Poll ``predicate`` every half second; AssertionError naming ``what`` on timeout."""
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.5)

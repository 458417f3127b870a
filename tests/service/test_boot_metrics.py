"""The metrics textfile after a boot: the boot retires the old one, the daemon writes the new."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from service.cmd.host import Host
from service.daemon.loop import Daemon
from service.daemon.timers import Timers
from service.rebooting.request import NoRebooter
from stager.drop import ModuleSpec, stage
from tests.kmod import SigningKey, sign
from tests.service.fakes import FakeSysfs, make_host

ROOT = Path(__file__).resolve().parents[2]
PROBE = """
import io, sys
from service.cli import main
rc = main(["boot", "--root", sys.argv[1]], io.StringIO())
status = ("service.status.metrics", "service.status.survey", "service.status.collect")
print(rc, *(name in sys.modules for name in status))
"""


def test_boot_retires_the_old_textfile_and_the_daemons_first_pass_writes_the_new(
    tmp_path: Path, kernel: str, modules: dict[str, Path], rsa_key: SigningKey
) -> None:
    """``modstage boot`` imports no status collection and removes the previous boot's
    textfile (stale phases are worse than none); the daemon, started after it, writes
    the textfile in its first pass, naming the phase the boot left."""
    layout = make_host(tmp_path / "root", kernel, rsa_key.cert_pem)
    module = sign(modules["ms_exporter"], rsa_key, tmp_path / "ms_exporter.ko")
    stage(layout.incoming, bundle="b", version="1", kernel=kernel, modules=[ModuleSpec(module)])
    subprocess.run(
        [sys.executable, "-m", "service.cli", "intake", "--root", str(layout.root)],
        cwd=ROOT,
        check=True,
        capture_output=True,
    )
    layout.metrics.parent.mkdir(parents=True, exist_ok=True)
    layout.metrics.write_text('modstage_bundle_phase{bundle="b",phase="pending"} 1\n')
    done = subprocess.run(
        [sys.executable, "-c", PROBE, str(layout.root)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
    )
    assert done.stdout.split() == ["0", "False", "False", "False"], done.stderr
    assert not layout.metrics.exists()

    host = Host(layout)
    daemon = Daemon(layout, host.config, host.intake, NoRebooter(), sysfs=FakeSysfs(layout.sys))
    daemon.step([], Timers.start(daemon.clock.monotonic(), daemon.rescan_every, None))
    text = layout.metrics.read_text()
    assert 'modstage_bundle_phase{bundle="b",phase="active"} 1' in text

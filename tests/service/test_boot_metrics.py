"""The metrics textfile follows a boot, written by a child `modstage boot` does not wait for."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from stager.drop import ModuleSpec, stage
from tests.kmod import SigningKey, sign
from tests.service.fakes import make_host

ROOT = Path(__file__).resolve().parents[2]
PROBE = """
import io, sys
from service.cli import main
rc = main(["boot", "--root", sys.argv[1]], io.StringIO())
print(rc, "service.status.metrics" in sys.modules, "service.status.collect" in sys.modules)
"""


def test_boot_writes_metrics_after_it_exits_and_never_collects_status_itself(
    tmp_path: Path, kernel: str, modules: dict[str, Path], rsa_key: SigningKey
) -> None:
    """The boot process imports no status collection; its child writes the textfile
    (the pipes close only when it is done), naming the bundle's phase."""
    layout = make_host(tmp_path / "root", kernel, rsa_key.cert_pem)
    module = sign(modules["ms_exporter"], rsa_key, tmp_path / "ms_exporter.ko")
    stage(layout.incoming, bundle="b", version="1", kernel=kernel, modules=[ModuleSpec(module)])
    subprocess.run(
        [sys.executable, "-m", "service.cli", "intake", "--root", str(layout.root)],
        cwd=ROOT,
        check=True,
        capture_output=True,
    )
    layout.metrics.unlink(missing_ok=True)
    done = subprocess.run(
        [sys.executable, "-c", PROBE, str(layout.root)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
    )
    assert done.stdout.split() == ["0", "False", "False"], done.stderr
    text = layout.metrics.read_text()
    assert 'modstage_bundle_phase{bundle="b",phase="active"} 1' in text


def test_a_caller_that_lives_on_reaps_its_earlier_metrics_writers(
    tmp_path: Path, kernel: str, rsa_key: SigningKey
) -> None:
    """The boot does not wait for its metrics writer; a caller that boots again reaps the
    earlier writer once it is done, so no finished writer is left unreaped."""
    import io
    import os

    from service.cmd import boot as cmd_boot

    layout = make_host(tmp_path / "root", kernel, rsa_key.cert_pem)
    cmd_boot._writers.clear()
    cmd_boot.metrics_in_background(layout, io.StringIO())
    [first] = cmd_boot._writers
    os.waitid(os.P_PID, first, os.WEXITED | os.WNOWAIT)  # it is done, not yet reaped
    cmd_boot.metrics_in_background(layout, io.StringIO())
    try:
        assert first not in cmd_boot._writers
        with pytest.raises(ChildProcessError):
            os.waitpid(first, os.WNOHANG)  # reaped already
        assert layout.metrics.read_text()
    finally:
        for pid in cmd_boot._writers:
            os.waitpid(pid, 0)
        cmd_boot._writers.clear()

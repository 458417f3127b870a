"""``modstage wait --drop``: only a drop is waited for; the README's shell form fails when
its ``stage`` fails, whatever the status file names."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from service.layout import Layout
from service.publish.bundle_status import write_status
from stager.schema.paths import drop_name
from stager.wait import EXIT_USAGE
from tests.stager.test_wait import GEN, active
from tests.stager.test_wait_errors import wait

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize(
    ("drop", "words"),
    [
        ("", "--drop is empty: the `modstage stage` before it probably failed"),
        (".", "--drop is empty"),
        ("/var/lib/modstage/incoming", "is not a drop"),
        ("/tmp/nvidia.1.x", "is not a drop"),
        (drop_name("other", 10**18, "ab"), "is a drop of bundle 'other', not 'nvidia'"),
    ],
)
def test_a_drop_option_that_names_no_drop_of_the_bundle_exits_2(
    tmp_path: Path, drop: str, words: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """``--drop`` with an empty value or a path that is not a drop of the bundle is refused
    (exit 2, one line saying why), even while the status file names an active generation:
    never an answer for a generation the drop did not make."""
    layout = Layout(tmp_path)
    write_status(layout, "nvidia", active(), generation=GEN)
    code, out = wait(layout.status, "--drop", drop, "--timeout", "0")
    err = capsys.readouterr().err
    assert code == EXIT_USAGE and "is active" not in out, out
    assert words in err and len(err.splitlines()) == 1 and "Traceback" not in err


def test_the_readme_form_fails_when_its_stage_fails(tmp_path: Path) -> None:
    """``modstage wait --drop "$(modstage stage …)"`` in a shell: a stage that fails (its
    module is missing) makes the whole command fail with wait's exit 2 and stage's error,
    though the status file names the previous generation active (exit 0 before)."""
    layout = Layout(tmp_path)
    write_status(layout, "nvidia", active(), generation=GEN)
    layout.incoming.mkdir(parents=True)
    script = (
        f'modstage() {{ "{sys.executable}" -m service.cli "$@"; }}\n'
        f'modstage wait --bundle nvidia --status-dir "{layout.status}" --timeout 0 --drop '
        f'"$(modstage stage --into "{layout.incoming}" --bundle nvidia --version 2 '
        f'--kernel 6.1 --module "{tmp_path}/missing.ko")"\n'
    )
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    result = subprocess.run(
        ["sh", "-c", script], env=env, capture_output=True, text=True, check=False, timeout=120
    )
    assert result.returncode == EXIT_USAGE, result
    assert "missing.ko: cannot open" in result.stderr
    assert "--drop is empty" in result.stderr and "is active" not in result.stdout

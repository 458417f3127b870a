"""The container side runs with nothing installed but tomli-w."""

from __future__ import annotations

import shutil
import subprocess
import tomllib
import venv
from pathlib import Path

import tomli_w

from tests.stager.argv import module_bytes, stage_argv

ROOT = Path(__file__).resolve().parents[2]


def test_stage_runs_in_a_venv_holding_only_tomli_w(tmp_path: Path) -> None:
    """`modstage stage` works in a venv whose only package is tomli-w; host deps are absent."""
    env_dir = tmp_path / "venv"
    venv.create(env_dir, with_pip=False, system_site_packages=False)
    python = env_dir / "bin" / "python"
    site = Path(
        subprocess.check_output(
            [python, "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"], text=True
        ).strip()
    )
    shutil.copytree(Path(tomli_w.__file__).parent, site / "tomli_w")
    env = {"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"}

    probe = subprocess.run(
        [python, "-c", "import cryptography"], env=env, capture_output=True, text=True, check=False
    )
    assert probe.returncode != 0, "the venv must not see the host's packages"
    listed = sorted(p.name for p in site.iterdir() if not p.name.startswith(("_", ".")))
    assert listed == ["tomli_w"]

    module = tmp_path / "ms_params.ko"
    module.write_bytes(module_bytes(104))
    incoming = tmp_path / "incoming"
    incoming.mkdir()
    result = subprocess.run(
        [
            python,
            "-m",
            "service.cli",
            *stage_argv(
                incoming,
                "--module",
                f"{module}:count=3",
                bundle="test",
                version="1.0",
                kernel="6.1.0-57-amd64",
            ),
        ],
        env=env,
        capture_output=True,
        text=True,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    drop = Path(result.stdout.strip())
    manifest = tomllib.loads((drop / "manifest.toml").read_text())
    assert manifest["module"][0]["params"] == "count=3"

    loaded = subprocess.run(
        [
            python,
            "-c",
            "import sys, service.cli, stager.drop; "
            "print(sorted(m for m in sys.modules if m.split('.')[0] in "
            "('cryptography', 'asn1crypto', 'pyudev', 'watchdog', 'structlog')))",
        ],
        env=env,
        capture_output=True,
        text=True,
        check=True,
    )
    assert loaded.stdout.strip() == "[]"

"""Run ``deploy/install.sh`` as a new user would, into a temporary root.

The package is a wheel built from the checkout's tracked files (what a release would ship);
its dependencies come from a wheelhouse that pip fills once per dependency set and caches, so
later installs run offline (``--wheels``).
"""

from __future__ import annotations

import hashlib
import shutil
import subprocess
import sys
from pathlib import Path

from tests.vm.harness.kernel import cache_dir

REPO = Path(__file__).resolve().parents[1]
INSTALL = REPO / "deploy/install.sh"


def pip(*argv: str | Path) -> None:
    """Run the test interpreter's pip; AssertionError with its output on failure."""
    done = subprocess.run(
        [sys.executable, "-m", "pip", "--disable-pip-version-check", "-q", *map(str, argv)],
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == 0, f"pip {' '.join(map(str, argv))}:\n{done.stdout}{done.stderr}"


def build_wheel(out: Path) -> Path:
    """A wheel of the checkout's tracked files (no stray build output, no untracked files)."""
    tracked = subprocess.run(
        ["git", "ls-files", "-z"], cwd=REPO, capture_output=True, check=True
    ).stdout.split(b"\0")
    source = out / "source"
    for name in filter(None, tracked):
        path = REPO / name.decode()
        if path.is_file():
            (source / name.decode()).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(path, source / name.decode())
    pip("wheel", "--no-deps", "-w", out / "dist", source)
    (wheel,) = (out / "dist").glob("modstage-*.whl")
    return wheel


def wheelhouse(wheel: Path) -> Path:
    """Wheels of modstage's host dependencies, cached per pyproject.toml."""
    key = hashlib.sha256((REPO / "pyproject.toml").read_bytes()).hexdigest()[:16]
    house = cache_dir() / f"wheels-{key}"
    if not (house / ".complete").exists():
        pip("wheel", "-w", house, f"modstage[host] @ {wheel.as_uri()}")
        for own in house.glob("modstage-*.whl"):
            own.unlink()
        (house / ".complete").touch()
    return house


def install(root: Path, *argv: str | Path) -> subprocess.CompletedProcess[str]:
    """``deploy/install.sh --root ROOT ARGV...``, as a completed process (not checked)."""
    return subprocess.run(
        ["sh", str(INSTALL), "--root", str(root), *map(str, argv)],
        capture_output=True,
        text=True,
        check=False,
        timeout=600,
    )

"""Run ``deploy/install.sh`` as a new user would, into a temporary root.

The package is the checkout's tracked files, as a source tree (what ``deploy/install.sh``
installs by default) or built into a wheel (what a release would ship); its dependencies and
build backend come from a wheelhouse that pip fills once per dependency set and caches, so
later installs run offline (``--wheels``).
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

from tests.vm.harness.kernel import cache_dir

REPO = Path(__file__).resolve().parents[1]
INSTALL = REPO / "deploy/install.sh"
BACKEND = "setuptools>=65"  # pyproject.toml's build-system requirement


@contextlib.contextmanager
def _filling(house: Path) -> Iterator[bool]:
    """Hold ``house``'s lock (another test process may be filling it); yields whether it
    still needs filling (no ``.complete`` marker yet)."""
    house.parent.mkdir(parents=True, exist_ok=True)
    with open(house.with_name(f"{house.name}.lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield not (house / ".complete").exists()


def pip(*argv: str | Path) -> None:
    """Run the test interpreter's pip; AssertionError with its output on failure."""
    done = subprocess.run(
        [sys.executable, "-m", "pip", "--disable-pip-version-check", "-q", *map(str, argv)],
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == 0, f"pip {' '.join(map(str, argv))}:\n{done.stdout}{done.stderr}"


def checkout(out: Path) -> Path:
    """A copy of the checkout's tracked files (no build output, nothing untracked)."""
    tracked = subprocess.run(
        ["git", "ls-files", "-z"], cwd=REPO, capture_output=True, check=True
    ).stdout.split(b"\0")
    source = out / "source"
    for name in filter(None, tracked):
        path = REPO / name.decode()
        if path.is_file():
            (source / name.decode()).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(path, source / name.decode())
    return source


def build_wheel(out: Path) -> Path:
    """A wheel of the checkout's tracked files."""
    pip("wheel", "--no-deps", "-w", out / "dist", checkout(out))
    (wheel,) = (out / "dist").glob("modstage-*.whl")
    return wheel


def wheelhouse(package: Path) -> Path:
    """Wheels of modstage's host dependencies and of its build backend (to install from a
    source tree offline), cached per pyproject.toml; ``package`` is a wheel or source tree."""
    key = hashlib.sha256((REPO / "pyproject.toml").read_bytes() + BACKEND.encode())
    house = cache_dir() / f"wheels-{key.hexdigest()[:16]}"
    with _filling(house) as empty:
        if not empty:
            return house
        pip("wheel", "-w", house, f"modstage[host] @ {package.as_uri()}", BACKEND)
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


def requirements() -> list[str]:
    """modstage's own and host dependencies, as pyproject.toml names them."""
    import tomllib

    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    return [*project["dependencies"], *project["optional-dependencies"]["host"]]


def wheelhouse_for(python: str) -> Path:
    """Binary wheels of modstage's host dependencies for another CPython (``"3.13"``: Debian
    13's), fetched once by this interpreter's pip and cached per pyproject.toml; install
    modstage's own wheel from it (no build backend needed)."""
    tag = python.replace(".", "")
    key = hashlib.sha256((REPO / "pyproject.toml").read_bytes() + python.encode())
    house = cache_dir() / f"wheels-cp{tag}-{key.hexdigest()[:16]}"
    with _filling(house) as empty:
        if not empty:
            return house
        platforms = [
            f"--platform={p}_x86_64"
            for p in ("manylinux_2_34", "manylinux_2_28", "manylinux_2_17", "manylinux2014")
        ]
        abis = [f"--abi={a}" for a in (f"cp{tag}", "abi3", "none")]
        pip(
            "download",
            "--only-binary=:all:",
            f"--python-version={python}",
            "--implementation=cp",
            *platforms,
            *abis,
            "-d",
            house,
            *requirements(),
        )
        (house / ".complete").touch()
    return house


def install_in_debian13(tree: Path, wheel: Path) -> subprocess.CompletedProcess[str]:
    """``deploy/install.sh --root TREE --from WHEEL`` run inside a fresh Debian 13 root
    (``debian.install_root``, with ``chroot``: its Python 3.13 builds the venv), dependencies
    offline from :func:`wheelhouse_for`; the tree, which may hold files already, is copied in
    and the result copied back. Not checked: the completed process."""
    import tempfile

    from tests.vm.harness import debian

    root = debian.install_root()
    scratch = Path(tempfile.mkdtemp(prefix="modstage-install-", dir=root / "tmp"))
    inside = f"/tmp/{scratch.name}"
    try:
        checkout(scratch)
        shutil.copy(wheel, scratch / wheel.name)
        shutil.copytree(wheelhouse_for("3.13"), scratch / "wheels")
        shutil.copytree(tree, scratch / "tree", symlinks=True, dirs_exist_ok=True)
        env = {"PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "LANG": "C.UTF-8", "HOME": "/root"}
        argv = ["sh", f"{inside}/source/deploy/install.sh", "--root", f"{inside}/tree"]
        argv += ["--from", f"{inside}/{wheel.name}", "--wheels", f"{inside}/wheels"]
        done = subprocess.run(
            ["chroot", str(root), *argv], capture_output=True, text=True, check=False, env=env
        )
        if done.returncode == 0:
            shutil.copytree(scratch / "tree", tree, symlinks=True, dirs_exist_ok=True)
        return done
    finally:
        shutil.rmtree(scratch, ignore_errors=True)

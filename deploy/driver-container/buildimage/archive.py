"""Debian's NVIDIA packages, fetched with an apt configuration of the build cache's own.

The machine's apt sources and package state are never touched: a ``sources.list`` naming
the components the NVIDIA packages live in (``contrib``, ``non-free``,
``non-free-firmware``), and apt's state, lists and cache directories, all sit under
``<cache>/nvidia-apt``. ``apt-get update`` and ``apt-get download`` run against that
configuration alone (signatures checked with Debian's archive keyring) and the ``.deb``
files are kept in ``<cache>/nvidia-debs``, so a package is downloaded once per machine.

An archive that cannot be reached, or a version it no longer carries, raises
:class:`ArchiveError` naming the package, the version and apt's own words.
"""

from __future__ import annotations

import fcntl
import os
import shutil
import subprocess
import tempfile
from pathlib import Path

from buildimage import BuildError

MIRROR = os.environ.get("MODSTAGE_DEBIAN_MIRROR", "http://deb.debian.org/debian")
KEYRING = Path("/usr/share/keyrings/debian-archive-keyring.gpg")
SUITES = ("bookworm", "bookworm-backports", "trixie", "sid")
COMPONENTS = "contrib non-free non-free-firmware"


class ArchiveError(BuildError):
    """A package could not be fetched from Debian's archive (the words say which and why)."""


def _apt_dir(cache: Path) -> Path:
    root = cache / "nvidia-apt"
    for sub in ("state/lists/partial", "cache/archives/partial", "etc/parts", "etc/prefs"):
        (root / sub).mkdir(parents=True, exist_ok=True)
    sources = "".join(
        f"deb [signed-by={KEYRING}] {MIRROR} {suite} {COMPONENTS}\n" for suite in SUITES
    )
    if not (root / "sources.list").is_file() or (root / "sources.list").read_text() != sources:
        (root / "sources.list").write_text(sources)
    (root / "status").touch()
    return root


def apt_options(root: Path) -> list[str]:
    """``-o`` options that point every apt path at ``root`` (the host's stay untouched)."""
    settings = {
        "Dir::Etc::sourcelist": root / "sources.list",
        "Dir::Etc::sourceparts": root / "etc/none",
        "Dir::Etc::parts": root / "etc/parts",
        "Dir::Etc::preferencesparts": root / "etc/prefs",
        "Dir::State": root / "state",
        "Dir::State::status": root / "status",
        "Dir::Cache": root / "cache",
        "APT::Sandbox::User": "root",
        "Acquire::Languages": "none",
        "Acquire::Retries": "3",
        # sid's Release file is valid for a week; the archive reached may serve an older one
        "Acquire::Check-Valid-Until": "false",
    }
    return [arg for k, v in settings.items() for arg in ("-o", f"{k}={v}")]


def _apt(argv: list[str], cwd: Path, what: str) -> None:
    proc = subprocess.run(argv, cwd=cwd, capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        raise ArchiveError(
            f"{what}: {' '.join(argv[:1] + argv[-3:])} failed ({proc.returncode}) against "
            f"{MIRROR}; is Debian's archive reachable?\n{proc.stdout[-2000:]}{proc.stderr[-2000:]}"
        )


def deb(cache: Path, package: str, version: str) -> Path:
    """The ``.deb`` of ``package`` at exactly ``version`` (e.g. ``535.261.03-1``), kept under
    ``cache``."""
    debs = cache / "nvidia-debs"
    debs.mkdir(exist_ok=True)
    final = debs / f"{package}_{version.replace(':', '%3a')}_amd64.deb"
    if final.is_file():
        return final
    with open(cache / "nvidia-apt.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if final.is_file():
            return final
        root = _apt_dir(cache)
        options = apt_options(root)
        lists = root / "state/lists"
        if not any(lists.glob("*Packages*")):
            _apt(["apt-get", *options, "-q", "update"], root, f"{package} {version}")
        work = Path(tempfile.mkdtemp(prefix="download-", dir=debs))
        try:
            argv = ["apt-get", *options, "-q", "download", f"{package}={version}"]
            try:
                _apt(argv, work, f"{package} {version}")
            except ArchiveError:  # stale lists: refresh once and ask again
                _apt(["apt-get", *options, "-q", "update"], root, f"{package} {version}")
                _apt(argv, work, f"{package} {version}")
            [got] = work.glob("*.deb")
            got.rename(final)
        finally:
            shutil.rmtree(work, ignore_errors=True)
    return final


def extract(package: Path, into: Path) -> Path:
    """``dpkg-deb -x package into``: the package's files under ``into``."""
    into.mkdir(parents=True, exist_ok=True)
    proc = subprocess.run(
        ["dpkg-deb", "-x", str(package), str(into)], capture_output=True, text=True, check=False
    )
    if proc.returncode != 0:
        raise ArchiveError(f"dpkg-deb -x {package} failed: {proc.stderr.strip()}")
    return into

"""Debian 12's own Python libraries, unpacked from its packages into the test cache.

``python -m tests.debian_libs`` (run by ``.ci/install``) fetches, with this Debian 12 host's
apt (``apt-get download``: nothing is installed), the ``python3-*`` packages modstage's
Debian package depends on and those its tests need, each with its ``python3-*``
dependencies, and unpacks them (``dpkg-deb -x``) into one tree under the test cache. Debian's
``/usr/bin/python3`` run with ``-S`` (no site directories) and ``PYTHONPATH`` on that tree
imports exactly Debian 12's libraries: cryptography 38 on the system's OpenSSL, zstandard
0.20, structlog 22.3, pyudev 0.24, watchdog 2.2.1, rich 13.3 (``tests/test_debian_libs.py``).
"""

from __future__ import annotations

import hashlib
import subprocess
import sys
import tempfile
from pathlib import Path

from tests.kmod.build import cache_root

#: what the .deb depends on (deploy/debian/control), then what the tests below use
PRODUCT = (
    "python3-cryptography",
    "python3-zstandard",
    "python3-structlog",
    "python3-pyudev",
    "python3-watchdog",
    "python3-tomli-w",
    "python3-rich",
)
TESTING = (
    "python3-pytest",
    "python3-hypothesis",
    "python3-asn1crypto",
    "python3-yaml",
    "python3-prometheus-client",
)
#: parts of Debian's python3 itself, not libraries
_SKIP = {"python3-minimal", "python3-distutils", "python3-lib2to3"}


def _closure(packages: tuple[str, ...]) -> list[str]:
    out = subprocess.run(
        [
            *("apt-cache", "depends", "--recurse", "--no-recommends", "--no-suggests"),
            *("--no-conflicts", "--no-breaks", "--no-replaces", "--no-enhances"),
            *packages,
        ],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    names = {line for line in out.splitlines() if line.startswith("python3-")}
    return sorted(names - _SKIP)


def site() -> Path:
    """The unpacked libraries' ``dist-packages`` directory, fetched once (cached)."""
    key = hashlib.sha256("\0".join(PRODUCT + TESTING).encode()).hexdigest()[:12]
    tree = cache_root() / f"debian12-libs-{key}"
    packages = tree / "usr/lib/python3/dist-packages"
    if (tree / ".complete").exists():
        return packages
    names = _closure(PRODUCT + TESTING)
    with tempfile.TemporaryDirectory(dir=cache_root()) as tmp:
        subprocess.run(
            ["apt-get", "-oAPT::Sandbox::User=root", "download", "-qq", *names], cwd=tmp, check=True
        )
        work = Path(tmp) / "tree"
        for deb in sorted(Path(tmp).glob("*.deb")):
            subprocess.run(["dpkg-deb", "-x", str(deb), str(work)], check=True)
        (work / ".complete").write_text(" ".join(p.name for p in Path(tmp).glob("*.deb")) + "\n")
        if tree.exists():
            subprocess.run(["rm", "-rf", str(tree)], check=True)
        work.rename(tree)
    return packages


if __name__ == "__main__":
    print(f"Debian 12's python3 libraries in {site()}")
    sys.exit(0)

"""modstage runs on Debian 12's own Python libraries, the ones its .deb depends on.

Debian's ``/usr/bin/python3`` with ``-S`` (no site directories, so nothing pip installed)
imports only the libraries unpacked from Debian 12's packages (``tests/debian_libs.py``):
cryptography 38.0.4 on the system's OpenSSL, zstandard 0.20, structlog 22.3, pyudev 0.24,
watchdog 2.2.1, rich 13.3, tomli-w 1.0, and Debian's pytest 7.2 runs the tests of what
touches each of them: the drop watch and a real overflow of the kernel's inotify queue
(watchdog 2.2.1 reports no lost events: the periodic rescan finds a lost drop), the kernel
watch and the kernel hook's rename, the daemon's event cycle, ECDSA signatures (cryptography), zstd bounds (zstandard), the log (structlog),
uevents (pyudev), status (rich), intake and signatures end to end, the CLI. About 50 s; the
libraries are fetched once into the test cache (``.ci/install``).
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from tests.debian_libs import site

pytestmark = pytest.mark.debian  # Debian's python3 and the Debian 12 libraries of the test cache

ROOT = Path(__file__).resolve().parent.parent
PYTHON = "/usr/bin/python3"  # Debian's
TESTS = [
    "tests/service/test_watcher.py",
    "tests/service/test_kernel_watch.py",
    "tests/service/test_daemon.py",
    "tests/service/test_ecdsa_pubkey.py",
    "tests/service/test_decompress_bounds.py",
    "tests/service/test_logs.py",
    "tests/service/test_uevents.py",
    "tests/service/test_status.py",
    "tests/service/test_trust.py",
    "tests/service/test_signature.py",
    "tests/service/test_intake.py",
    "tests/service/test_cli.py",
    "tests/service/test_dependencies.py",
]
EXPECTED = {
    "cryptography": "38.0.4",
    "zstandard": "0.20.0",
    "structlog": "22.3.0",
    "pyudev": "0.24.0",
    "watchdog": "2.2.1",
    "rich": "13.3.1",
    "tomli-w": "1.0.0",
}


def _env() -> dict[str, str]:
    return {
        "PATH": "/usr/sbin:/usr/bin:/sbin:/bin",
        "HOME": os.environ.get("HOME", "/root"),
        "PYTHONPATH": f"{site()}:{ROOT}",
        "LANG": "C.UTF-8",
        **{k: v for k, v in os.environ.items() if k.startswith("MODSTAGE_")},
    }


def test_the_interpreter_sees_debian_12s_libraries_only() -> None:
    """Under ``-S`` each library resolves to Debian 12's version, from the unpacked tree
    (watchdog's module as well as its metadata)."""
    probe = (
        "import importlib.metadata as m, importlib.util as u, cryptography;"
        f"print([m.version(d) for d in {sorted(EXPECTED)!r}]);"
        "print(cryptography.__file__); print(u.find_spec('watchdog').origin)"
    )
    out = subprocess.run(
        [PYTHON, "-S", "-c", probe], env=_env(), capture_output=True, text=True, check=True
    ).stdout.splitlines()
    assert out[0] == str([EXPECTED[d] for d in sorted(EXPECTED)])
    assert out[1].startswith(str(site()))
    assert out[2].startswith(str(site()))


def test_the_unit_tests_of_every_library_use_pass_on_debian_12s_libraries() -> None:
    """The tests listed above pass under Debian's interpreter and libraries (pytest's own
    summary must say passed and nothing failed, errored or was skipped)."""
    done = subprocess.run(
        [PYTHON, "-S", "-m", "pytest", "-q", "-p", "no:cacheprovider", "-rs", *TESTS],
        env=_env(),
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=False,
        timeout=600,
    )
    tail = done.stdout[-3000:] + done.stderr[-2000:]
    assert done.returncode == 0, tail
    summary = done.stdout.strip().splitlines()[-1]
    assert " passed" in summary and "skipped" not in summary, summary

"""``lock_modules``: once every bundle had its turn, ``modstage boot`` writes 1 to
``kernel.modules_disabled`` (nothing loads a module until the next reboot); ``status`` shows
the lock, and grades the host degraded when the config asks for it and the lock is off."""

from __future__ import annotations

import io
import json
from pathlib import Path

from service.cli import main
from service.layout import Layout
from tests.service.fakes import pending
from tests.service.test_sequences import reboot


def cli(*argv: str) -> tuple[int, str]:
    """``modstage ARGV`` in this process: (exit code, stdout)."""
    out = io.StringIO()
    return main(list(argv), out), out.getvalue()


def test_boot_locks_module_loading_after_the_bundles_and_status_says_so(
    host: Layout, signed: dict[str, Path], kernel: str
) -> None:
    """With ``lock_modules = true`` and ``kernel.modules_disabled`` 0: status grades the host
    degraded naming the file; ``boot`` loads the bundle, then writes 1 and says so; status is
    healthy and prints the lock (``--json``: ``modules_locked`` true). Without the key boot
    leaves the file alone."""
    root = ["--root", str(host.root)]
    host.modules_disabled.write_text("0\n")
    pending(host, kernel, [(signed["ms_exporter"], "")], bundle="demo")
    code, out = cli("boot", *root)
    assert code == 0 and host.modules_disabled.read_text() == "0\n", out  # not asked
    assert "modules:" not in out
    host.config.write_text("lock_modules = true\n")
    code, out = cli("status", *root, "--json")
    doc = json.loads(out)
    assert doc["health"] == "degraded" and doc["modules_locked"] is False
    assert any(str(host.modules_disabled) in p["reason"] for p in doc["problems"])
    reboot(host)
    host.modules_disabled.write_text("0\n")  # a new boot: the kernel starts unlocked
    code, out = cli("boot", *root)
    assert code == 0, out
    assert host.modules_disabled.read_text() == "1\n"
    assert out.rstrip().endswith(
        "modules: locked until the next reboot (kernel.modules_disabled = 1, lock_modules)"
    )
    code, out = cli("status", *root)
    assert code == 0 and "modules: locked until the next reboot" in out, out
    assert json.loads(cli("status", *root, "--json")[1])["modules_locked"] is True


def test_a_lock_that_cannot_be_written_is_said_and_the_boot_goes_on(
    host: Layout, signed: dict[str, Path], kernel: str
) -> None:
    """``kernel.modules_disabled`` unwritable (a directory here): boot prints ``modules: NOT
    locked`` with the reason, and its exit code is the bundles' (0)."""
    host.modules_disabled.mkdir(parents=True)
    host.config.write_text("lock_modules = true\n")
    pending(host, kernel, [(signed["ms_exporter"], "")], bundle="demo")
    code, out = cli("boot", "--root", str(host.root))
    assert code == 0 and f"modules: NOT locked: {host.modules_disabled}" in out, out

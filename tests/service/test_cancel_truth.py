"""Taking back a pending generation brings the active one back only when it is up: after a
boot that could not load it, the undo makes it the one the next boot loads, and nothing
calls it active (sequences the model, ``test_model.py``, found)."""

from __future__ import annotations

import errno
import io
from pathlib import Path

from service.bundles.phase import Phase
from service.bundles.statefile import load
from service.cli import main
from service.layout import Layout
from tests.hosts import KEEP, running_host
from tests.service.fakes import FakeKernel, boot_with, pending
from tests.service.test_sequences import reboot


def cli(*argv: str) -> tuple[int, str]:
    """``modstage ARGV`` in this process: (exit code, stdout)."""
    out = io.StringIO()
    return main(list(argv), out), out.getvalue()


def a_failed_active_with_a_passed_over_pending(
    host: Layout, signed: dict[str, Path], kernel: str
) -> tuple[str, str]:
    """v1 active, then a boot into another kernel (nothing of v1 loaded), v2 pending and
    held, and a boot back on v1's kernel whose load of v1 fails (held: v2 is passed over);
    ``release`` makes v2 pending again. Returns (v1, v2)."""
    root = ["--root", str(host.root)]
    v1 = pending(host, kernel, [(signed["ms_exporter"], "")], bundle="demo")
    assert cli("boot", *root)[0] == 0
    reboot(host)
    running_host(host, "6.99.0-other", KEEP)
    assert cli("boot", *root)[0] == 1
    v2 = pending(host, kernel, [(signed["ms_params"], "")], version="2", bundle="demo")
    assert cli("hold", *root, "demo")[0] == 0
    reboot(host)
    running_host(host, kernel, KEEP)
    boot_with(host, FakeKernel(fail={"ms_exporter": errno.ENOKEY})).run()
    b = load(host.state).bundle("demo")
    assert (b.phase, b.active, b.loaded) == (Phase.FAILED, v1, ())
    assert cli("release", *root, "demo")[0] == 0
    assert load(host.state).bundle("demo").pending == v2
    return v1, v2


def test_rollback_to_an_active_generation_that_is_not_up_makes_it_pending(
    host: Layout, signed: dict[str, Path], kernel: str
) -> None:
    """``rollback demo <v1>`` while v1 is active but failed to load in this boot does not
    cancel back to ``active``: v1 is pending (the next boot loads it; v2 is rolled back from),
    a reboot is required for it, and ``wait`` does not exit 0."""
    root = ["--root", str(host.root)]
    v1, v2 = a_failed_active_with_a_passed_over_pending(host, signed, kernel)
    code, out = cli("rollback", *root, "demo", v1[:12])
    assert code == 0, out
    b = load(host.state).bundle("demo")
    assert (b.phase, b.active, b.pending) == (Phase.PENDING, v1, v1), b.history[-1]
    assert b.generations[v2].rolled_back, "the pending one it replaced is kept out"
    code, out = cli("wait", "--status-dir", str(host.status), "--bundle", "demo", "--timeout", "0")
    assert code != 0, out
    code, out = cli("status", *root, "--reboot-required")
    assert code == 0 and "demo" in out, out


def test_retry_of_a_rolled_back_active_generation_that_is_not_up_makes_it_pending(
    host: Layout, signed: dict[str, Path], kernel: str
) -> None:
    """v1 active and rolled back from (a rollback to v0 pending), its load failed in this
    boot: ``retry`` of v1 clears the rollback and makes v1 pending, never ``active`` with
    nothing of it loaded."""
    root = ["--root", str(host.root)]
    v0 = pending(host, kernel, [(signed["ms_exporter"], "")], version="0", bundle="demo")
    assert cli("boot", *root)[0] == 0
    reboot(host)
    v1, _ = a_failed_active_with_a_passed_over_pending(host, signed, kernel)
    assert cli("rollback", *root, "demo", v0[:12])[0] == 0
    code, out = cli("retry", *root, "demo", v1[:12])
    assert code == 0, out
    b = load(host.state).bundle("demo")
    assert (b.phase, b.active, b.pending) == (Phase.PENDING, v1, v1), b.history[-1]
    assert b.generations[v1].rolled_back is None
    code, out = cli("wait", "--status-dir", str(host.status), "--bundle", "demo", "--timeout", "0")
    assert code != 0, out


def test_undoing_a_retry_when_the_active_generation_is_not_up_keeps_the_failure(
    host: Layout, signed: dict[str, Path], kernel: str
) -> None:
    """v2 failed at boot and the fallback to v1 failed too (nothing up); ``retry`` clears
    v2's failure, ``rollback demo <v1>`` undoes it: v1 is pending (not cancelled back to
    active, since it is not up) and v2's failure is recorded again."""
    root = ["--root", str(host.root)]
    v1 = pending(host, kernel, [(signed["ms_exporter"], "")], bundle="demo")
    assert cli("boot", *root)[0] == 0
    v2 = pending(host, kernel, [(signed["ms_params"], "")], version="2", bundle="demo")
    reboot(host)
    fail = {"ms_params": errno.ENOKEY, "ms_exporter": errno.ENOKEY}
    boot_with(host, FakeKernel(fail=fail)).run()
    reason = load(host.state).bundle("demo").generations[v2].failed
    assert reason and not load(host.state).bundle("demo").active_up
    assert cli("retry", *root, "demo")[0] == 0
    assert load(host.state).bundle("demo").generations[v2].failed is None
    assert cli("rollback", *root, "demo", v1[:12])[0] == 0
    b = load(host.state).bundle("demo")
    assert (b.phase, b.pending) == (Phase.PENDING, v1)
    assert b.generations[v2].failed == reason, "the undo lost the recorded failure"

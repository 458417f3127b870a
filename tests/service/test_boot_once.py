"""``modstage boot`` acts once per boot: run again in the same boot, or after the daemon
started in it, it changes nothing and says so; a new boot id opens the window again;
``--force-live-load`` is the only way past it (service.boot.once)."""

from __future__ import annotations

import io
import json
import os
import shutil
from pathlib import Path

import pytest
from structlog.testing import capture_logs

from service.boot import once
from service.bundles.phase import Phase
from service.bundles.statefile import load
from service.cli import main
from service.config import Config
from service.daemon.loop import Daemon
from service.host.running import RunningHost
from service.layout import Layout
from service.rebooting.request import NoRebooter
from stager.drop import ModuleSpec, stage
from tests.hosts import KEEP, running_host
from tests.service.fakes import make_intake

NEXT_BOOT = "22222222-3333-4444-5555-666666666666\n"


def tree(root: Path) -> dict[str, bytes]:
    """Every regular file under ``root``'s var, run and sys trees, with its content."""
    files = {}
    for top in ("var", "run", "sys"):
        for dirpath, _, names in os.walk(root / top):
            for name in names:
                path = Path(dirpath) / name
                files[str(path.relative_to(root))] = path.read_bytes()
    return files


def reboot(layout: Layout) -> None:
    """Play a reboot in the sandbox (docs/sandbox.md): a new boot id, no module loaded."""
    running_host(layout, KEEP, NEXT_BOOT)
    shutil.rmtree(layout.sys / "module/ms_params", ignore_errors=True)


def boot(layout: Layout, *extra: str) -> tuple[int, str]:
    """``modstage boot --root ROOT EXTRA``: its exit code and output."""
    out = io.StringIO()
    code = main(["boot", "--root", str(layout.root), *extra], out)
    return code, out.getvalue()


def logged(capsys: pytest.CaptureFixture[str]) -> list[str]:
    """The events the commands run since the last call logged (JSON lines on stderr)."""
    lines = capsys.readouterr().err.splitlines()
    return [json.loads(line)["event"] for line in lines if line.startswith("{")]


def daemon_of(layout: Layout) -> Daemon:
    """The daemon of ``layout`` (its loop never runs here)."""
    return Daemon(layout, Config(), make_intake(layout), NoRebooter())


def staged(layout: Layout, module: Path, version: str) -> None:
    """A drop of bundle ``demo`` taken in: a pending generation."""
    stage(
        layout.incoming,
        bundle="demo",
        version=version,
        kernel=RunningHost.read(layout).need_release(),
        modules=[ModuleSpec(module, "count=3")],
    )
    assert main(["intake", "--root", str(layout.root)], io.StringIO()) == 0


def test_a_second_boot_in_the_same_boot_changes_nothing(
    host: Layout, module: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The first boot loads the pending generation; a second run in the same boot id
    exits 0, makes no kernel call, writes no file (state, history, status, sysfs,
    the window record: byte for byte) and says that nothing was done and why; after a
    new boot id the boot runs again."""
    staged(host, module, "1")
    code, text = boot(host)
    assert code == 0 and "not called: finit_module" in text, text
    assert load(host.state).bundle("demo").phase is Phase.ACTIVE
    staged(host, module, "2")  # a newer generation waits for its reboot
    before = tree(host.root)
    logged(capsys)
    code, text = boot(host)
    assert code == 0, text
    assert "not called" not in text
    assert text.startswith("modstage boot: nothing done: modstage boot ran in this boot at ")
    assert "pending generations load at the next boot" in text
    assert tree(host.root) == before
    assert logged(capsys) == ["boot.already_done"]
    reboot(host)
    code, text = boot(host)
    assert code == 0 and "not called: finit_module" in text, text
    bundle = load(host.state).bundle("demo")
    assert bundle.phase is Phase.ACTIVE and bundle.generations[bundle.active].version == "2"


def test_a_daemon_started_first_closes_the_boot(host: Layout, module: Path) -> None:
    """A fresh node (no state at boot, the boot unit skipped): the daemon starts and
    closes the boot's window; a drop then taken in waits, and a boot run later in the same
    boot (a package upgrade, an admin starting the unit) changes nothing and names the
    daemon; the next boot loads the generation."""
    daemon = daemon_of(host)
    with capture_logs() as logs:  # the daemon's own log, not a command's
        daemon.close_boot_window()
    assert [e["event"] for e in logs] == ["boot.window_closed"]
    record = json.loads(host.boot_window.read_text())
    assert (record["boot_id"], record["by"]) == (host.boot_id.read_text().strip(), "daemon")
    daemon.close_boot_window()  # a restarted daemon: the record stays the first one's
    assert json.loads(host.boot_window.read_text()) == record
    staged(host, module, "1")
    before = tree(host.root)
    code, text = boot(host)
    assert code == 0 and "the daemon started before any modstage boot in this boot" in text
    assert tree(host.root) == before
    assert load(host.state).bundle("demo").phase is Phase.PENDING
    reboot(host)
    assert boot(host)[0] == 0
    assert load(host.state).bundle("demo").phase is Phase.ACTIVE


def test_the_daemon_keeps_a_boots_record(host: Layout) -> None:
    """A daemon started after the boot ran leaves the boot's record as it is."""
    assert boot(host)[0] == 0
    record = host.boot_window.read_bytes()
    daemon_of(host).close_boot_window()
    assert host.boot_window.read_bytes() == record


def test_force_live_load_runs_again_and_says_so(
    host: Layout, module: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """``--force-live-load`` runs the boot in a closed boot: it says so on its first line,
    logs ``boot.forced_live`` and loads."""
    assert boot(host)[0] == 0
    staged(host, module, "1")
    logged(capsys)
    code, text = boot(host, "--force-live-load")
    assert code == 0
    assert text.startswith("modstage boot: --force-live-load: modstage boot ran in this boot")
    assert "not called: finit_module" in text
    assert "boot.forced_live" in logged(capsys)
    assert load(host.state).bundle("demo").phase is Phase.ACTIVE


@pytest.mark.parametrize(
    "record", [b"", b"{", b'{"boot_id": 7, "by": "boot", "at": 1}', b'["x"]', b"\xff"]
)
def test_an_unreadable_record_counts_as_closed(host: Layout, module: Path, record: bytes) -> None:
    """A window record that cannot be read never leads to a live load: the boot changes
    nothing."""
    staged(host, module, "1")
    host.boot_window.parent.mkdir(parents=True, exist_ok=True)
    host.boot_window.write_bytes(record)
    code, text = boot(host)
    assert code == 0 and "nothing done" in text, text
    assert load(host.state).bundle("demo").phase is Phase.PENDING


def test_another_boots_record_leaves_the_window_open(host: Layout, module: Path) -> None:
    """A record of an earlier boot (a ``/run`` that persists, as a sandbox's) does not
    count; the boot acts and the record names this boot."""
    staged(host, module, "1")
    once.close(host, "an-earlier-boot", once.BOOT, 1.0)
    assert boot(host)[0] == 0
    assert load(host.state).bundle("demo").phase is Phase.ACTIVE
    assert json.loads(host.boot_window.read_text())["boot_id"] == host.boot_id.read_text().strip()


def test_state_saved_in_this_boot_counts_without_the_record(host: Layout, module: Path) -> None:
    """``state.json``'s boot id is the second witness: with the record gone, a state the
    boot saved in this boot still closes it."""
    staged(host, module, "1")
    assert boot(host)[0] == 0
    host.boot_window.unlink()
    assert once.closed(host, host.boot_id.read_text().strip()) == once.Closed(
        host.boot_id.read_text().strip(), once.BOOT, None
    )
    code, text = boot(host)
    assert code == 0 and "nothing done: modstage boot ran in this boot (boot id" in text


def blocked(layout: Layout) -> Path:
    """A directory, left by an earlier boot (its mtime before this boot began), where the
    window record goes: the record reads as absent and cannot be written."""
    layout.boot_window.mkdir(parents=True)
    (layout.boot_window / "x").write_text("")
    os.utime(layout.boot_window, (0, 0))
    return layout.boot_window


def test_an_unwritable_record_does_not_stop_the_boot(
    host: Layout, module: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The boot's first run still loads when the record cannot be written (an error is
    logged); the state's boot id then stops a second run."""
    staged(host, module, "1")
    blocked(host)
    logged(capsys)
    code, _ = boot(host)
    assert code == 0 and load(host.state).bundle("demo").phase is Phase.ACTIVE
    assert "boot.window_unrecorded" in logged(capsys)
    assert "nothing done" in boot(host)[1]

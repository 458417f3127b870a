"""The record that closes a boot's window for ``modstage boot`` is durable: it survives
``/run`` being cleared, the daemon takes no drop in until it is written, a rebuilt state
keeps the boot id, and a new boot id still opens the window (service.boot.once)."""

from __future__ import annotations

import io
import json
import os
import shutil
import threading
from pathlib import Path

import pytest
from structlog.testing import capture_logs

from service.boot import once
from service.bundles.phase import Phase
from service.bundles.statefile import load, locked
from service.cli import main
from service.host.running import RunningHost
from service.layout import Layout
from stager.drop import ModuleSpec, stage
from tests.service.test_boot_once import blocked, boot, daemon_of, reboot, staged


def dropped(layout: Layout, module: Path, version: str) -> None:
    """A drop of bundle ``demo`` waiting in incoming (no intake run)."""
    stage(
        layout.incoming,
        bundle="demo",
        version=version,
        kernel=RunningHost.read(layout).need_release(),
        modules=[ModuleSpec(module, "count=3")],
    )


def this_boot(layout: Layout) -> str:
    """The sandbox's boot id."""
    return layout.boot_id.read_text().strip()


def status(layout: Layout, *extra: str) -> str:
    """``modstage status --root ROOT EXTRA``: its output."""
    out = io.StringIO()
    main(["status", "--root", str(layout.root), *extra], out)
    return out.getvalue()


def test_clearing_run_does_not_reopen_a_window_the_daemon_closed(
    host: Layout, module: Path
) -> None:
    """A fresh node whose boot unit did not run: the daemon closes the window and takes a
    drop in; ``/run/modstage`` is then cleared (``systemctl clean --what=runtime``, an
    admin, tmpfiles). A ``modstage boot`` in the same boot still changes nothing."""
    daemon = daemon_of(host)
    assert daemon.close_boot_window()
    dropped(host, module, "1")
    assert [o.accepted for o in daemon.take_drops()] == [True]
    shutil.rmtree(host.run, ignore_errors=True)
    code, text = boot(host)
    assert code == 0 and "nothing done: the daemon started before any modstage boot" in text
    assert "not called" not in text
    assert load(host.state).bundle("demo").phase is Phase.PENDING


def test_the_daemon_takes_no_drop_in_while_it_cannot_record_the_window(
    host: Layout, module: Path
) -> None:
    """When the record cannot be written, the daemon logs it, takes no drop in (the drop
    waits in incoming, no generation is pending) and status says so; its next scan
    retries, records the window as the daemon's and takes the drop in; a boot in the same
    boot then changes nothing."""
    daemon = daemon_of(host)
    blocked(host)
    with capture_logs() as logs:
        assert not daemon.close_boot_window()
    assert [e["event"] for e in logs] == ["boot.window_unrecorded"]
    dropped(host, module, "1")
    assert daemon.take_drops() == []
    assert "demo" not in load(host.state).bundles
    assert any(host.incoming.iterdir())
    daemon.heartbeat(None)
    assert "TAKES NO DROP IN (boot window not recorded: " in status(host)
    paused = json.loads(status(host, "--json"))["daemon"]["intake_paused"]
    assert paused.startswith("boot window not recorded: ")
    shutil.rmtree(host.boot_window)
    assert [o.accepted for o in daemon.take_drops()] == [True]
    record = json.loads(host.boot_window.read_text())
    assert (record["boot_id"], record["by"]) == (this_boot(host), "daemon")
    daemon.heartbeat(None)  # the next beat is due at once: the pause is over
    assert "TAKES NO DROP IN" not in status(host)
    assert json.loads(status(host, "--json"))["daemon"]["intake_paused"] is None
    code, text = boot(host)
    assert code == 0 and "nothing done" in text
    assert load(host.state).bundle("demo").phase is Phase.PENDING


def test_the_daemon_writes_down_a_boot_known_from_the_state_alone(
    host: Layout, module: Path
) -> None:
    """A boot whose record could not be written (its state's boot id the only witness):
    the daemon records the window as the boot's before taking anything in, so a later
    loss of the state's boot id cannot reopen it."""
    staged(host, module, "1")
    blocked(host)
    assert boot(host)[0] == 0
    shutil.rmtree(host.boot_window)
    assert daemon_of(host).close_boot_window()
    record = json.loads(host.boot_window.read_text())
    assert (record["boot_id"], record["by"]) == (this_boot(host), "boot")


def test_a_rebuilt_state_keeps_the_boot_id_of_a_boot_that_ran(host: Layout, module: Path) -> None:
    """The boot ran in this boot; ``state.json`` then goes corrupt and the daemon rebuilds
    it: the rebuilt state keeps this boot's id, so even without the record a later
    ``modstage boot`` changes nothing."""
    staged(host, module, "1")
    assert boot(host)[0] == 0
    host.state.write_text("{corrupt")
    daemon_of(host).rebuild_state()
    assert load(host.state).boot_id == this_boot(host)
    host.boot_window.unlink()
    code, text = boot(host)
    assert code == 0 and "nothing done: modstage boot ran in this boot" in text


def test_a_rebuilt_state_claims_no_boot_the_daemon_closed(host: Layout, module: Path) -> None:
    """A window the daemon closed (no boot ran) gives a rebuilt state no boot id."""
    staged(host, module, "1")
    daemon = daemon_of(host)
    assert daemon.close_boot_window()
    host.state.write_text("{corrupt")
    daemon.rebuild_state()
    assert load(host.state).boot_id is None


def test_a_record_of_an_earlier_boot_opens_the_window_at_a_reboot(
    host: Layout, module: Path
) -> None:
    """The record persists across reboots: at a new boot id the boot loads, and an
    unreadable record last written before this boot began (an earlier boot's) counts as
    absent, never keeping a real boot from loading."""
    daemon_of(host).close_boot_window()
    staged(host, module, "1")
    reboot(host)
    host.boot_window.write_bytes(b"{")
    os.utime(host.boot_window, (0, 0))
    code, text = boot(host)
    assert code == 0 and "not called: finit_module" in text, text
    assert load(host.state).bundle("demo").phase is Phase.ACTIVE
    assert json.loads(host.boot_window.read_text())["boot_id"] == this_boot(host)


@pytest.mark.parametrize("boot_id", [None, "\n"])
def test_a_boot_id_that_cannot_be_read_loads_and_takes_in_nothing(
    host: Layout, module: Path, boot_id: str | None
) -> None:
    """Without a readable boot id (missing, empty) the boot loads nothing and the daemon
    takes no drop in."""
    staged(host, module, "1")
    if boot_id is None:
        host.boot_id.unlink()
    else:
        host.boot_id.write_text(boot_id)
    code, text = boot(host)
    assert code != 0 and "not called" not in text
    assert load(host.state).bundle("demo").phase is Phase.PENDING
    daemon = daemon_of(host)
    assert not daemon.close_boot_window()
    dropped(host, module, "2")
    assert daemon.take_drops() == []
    assert not host.boot_window.exists()


def test_the_boot_and_the_daemon_share_one_record(host: Layout) -> None:
    """The record is a file under the state directory, not under ``/run``."""
    assert host.boot_window.parent == host.var
    assert once.closed(host, this_boot(host)) is None


def test_the_daemon_closes_the_window_under_the_state_lock(host: Layout) -> None:
    """The daemon checks and writes the record under the state lock, so a ``modstage
    boot`` holding it (checking the window, or loading) is never raced: the record is
    written only once the lock is free."""
    daemon = daemon_of(host)
    with locked(host.var):
        worker = threading.Thread(target=daemon.close_boot_window)
        worker.start()
        worker.join(0.5)
        assert worker.is_alive() and not host.boot_window.exists()
    worker.join(10)
    assert not worker.is_alive()
    assert json.loads(host.boot_window.read_text())["by"] == "daemon"


def test_the_boot_checks_the_window_under_the_state_lock(host: Layout, module: Path) -> None:
    """A ``modstage boot`` waits for the state lock before it reads or writes the record
    (a daemon closing the window at that moment finishes first): with a drop taken in and
    the daemon's record written while it waited, the boot changes nothing."""
    staged(host, module, "1")
    result: list[tuple[int, str]] = []
    with locked(host.var):
        worker = threading.Thread(target=lambda: result.append(boot(host)))
        worker.start()
        worker.join(0.5)
        assert worker.is_alive() and not host.boot_window.exists()
        once.close(host, this_boot(host), once.DAEMON, 1.0)
    worker.join(30)
    assert result and "nothing done: the daemon started before any modstage boot" in result[0][1]
    assert load(host.state).bundle("demo").phase is Phase.PENDING


def test_every_scan_checks_the_record_first(host: Layout, module: Path) -> None:
    """A record removed while the daemon runs (an admin) is written again before the
    daemon's next scan takes a drop in, so a later boot in the same boot still changes
    nothing."""
    daemon = daemon_of(host)
    assert daemon.close_boot_window()
    host.boot_window.unlink()
    dropped(host, module, "1")
    assert [o.accepted for o in daemon.take_drops()] == [True]
    assert json.loads(host.boot_window.read_text())["boot_id"] == this_boot(host)
    code, text = boot(host)
    assert code == 0 and "nothing done" in text
    assert load(host.state).bundle("demo").phase is Phase.PENDING


def test_a_rebuild_without_a_boot_id_still_rebuilds(host: Layout, module: Path) -> None:
    """With no readable boot id the daemon's rebuild of a corrupt state still happens (the
    state has no boot id then): the next boot never finds ``state.json`` missing."""
    staged(host, module, "1")
    host.state.write_text("{corrupt")
    host.boot_id.unlink()
    daemon_of(host).rebuild_state()
    state = load(host.state)
    assert state.boot_id is None and "demo" in state.bundles

"""What the plain ``status`` view says when it has less to say: nothing printed as None,
an admin's act shown in its phase (not ``pending -> pending``), the backend once, a reboot
line that does not say "not required" when the state cannot be read, and a daemon that
stopped shown as stopped at once."""

from __future__ import annotations

import io
from dataclasses import replace
from pathlib import Path

from service.bundles.records import ModuleLoad
from service.bundles.state import State
from service.bundles.statefile import save
from service.cli import main
from service.config import Config
from service.daemon.loop import Daemon
from service.rebooting.request import NoRebooter
from service.status.collect import collect
from service.status.glance import write_heartbeat
from service.status.view import lines
from tests.service.test_status import active_bundle, host


def _plain(root: Path) -> tuple[int, str]:
    out = io.StringIO()
    return main(["status", "--root", str(root)], out), out.getvalue()


def test_a_module_without_srcversion_or_refcnt_prints_no_none(tmp_path: Path) -> None:
    """A module recorded without a srcversion, live without a refcnt file: the line leaves
    both out instead of printing ``None``."""
    b = active_bundle()
    layout = host(tmp_path, State({"nvidia": b}, "boot-2"))
    b = replace(b, loaded=(ModuleLoad("nvidia", None, None, already_loaded=True),))
    save(layout.state, State({"nvidia": b}, "boot-2"))
    (layout.sys / "module/nvidia/refcnt").unlink()
    _rc, text = _plain(tmp_path)
    line = next(ln for ln in text.splitlines() if ln.startswith("  module nvidia"))
    assert "None" not in text and line == "  module nvidia (already loaded; live)"


def test_an_admins_act_is_shown_in_its_phase(tmp_path: Path) -> None:
    """A hold recorded in history (from == to) reads ``[active] admin: hold …``."""
    b = active_bundle().record("admin: hold (no new generation, no reboot)")
    host(tmp_path, State({"nvidia": b}, "boot-2"))
    _rc, text = _plain(tmp_path)
    assert "active -> active" not in text
    assert any(
        ln.endswith("[active] admin: hold (no new generation, no reboot)")
        for ln in text.splitlines()
    )


def test_the_backend_is_named_once_on_the_reboot_line(tmp_path: Path) -> None:
    """With backend none the reason already names it: the details do not repeat it."""
    b = active_bundle()
    layout = host(tmp_path, State({"nvidia": b}, "boot-2"))
    from service.bundles.phase import Phase
    from service.bundles.state import Generation

    gen = Generation("c" * 64, "3.0", "6.1.0-test", added=300.0)
    pending = b.with_generation(gen).move(Phase.PENDING, pending=gen.id)
    host(tmp_path, State({"nvidia": pending}, "boot-2"))
    write_heartbeat(layout.heartbeat, decision="requested", at=0.0)
    reboot = next(ln for ln in lines(collect(layout)) if ln.startswith("reboot:"))
    assert reboot.count("backend none") == 1, reboot


def test_an_unreadable_state_makes_the_reboot_line_unknown(tmp_path: Path) -> None:
    """A corrupt state.json: ``--reboot-required`` cannot tell (exit 3), and the plain view
    says unknown, not "not required"."""
    layout = host(tmp_path, State({"nvidia": active_bundle()}, "boot-2"))
    layout.state.write_text("{")
    rc, text = _plain(tmp_path)
    reboot = next(ln for ln in text.splitlines() if ln.startswith("reboot:"))
    assert rc == 2 and "not required" not in reboot and reboot.startswith("reboot: unknown")
    out = io.StringIO()
    assert main(["status", "--root", str(tmp_path), "--reboot-required"], out) == 3


def test_a_stopped_daemon_is_not_alive_however_fresh_its_heartbeat(tmp_path: Path) -> None:
    """The daemon's last heartbeat says it stopped: status says stopped at once, not alive
    until the heartbeat grows stale."""
    layout = host(tmp_path, State({"nvidia": active_bundle()}, "boot-2"))
    daemon = Daemon(layout, Config(), None, NoRebooter())  # type: ignore[arg-type]
    daemon.stopped()
    report = collect(layout)
    assert not report.daemon.alive and report.daemon.age_seconds is not None
    assert report.daemon.age_seconds < 60
    daemon_line = next(ln for ln in lines(report) if ln.startswith("daemon:"))
    assert daemon_line.startswith("daemon: stopped at ") and "not running" in daemon_line

"""``status`` tells the truth: the kernel and boot id against the record, corrupt and garbled
files, an invalid config, other kernels, the daemon's heartbeat, the reboot window."""

from __future__ import annotations

import io
import json
import threading
import time
from datetime import UTC, datetime
from pathlib import Path

from service.bundles import verbs
from service.bundles.phase import Phase
from service.bundles.records import RebootIntent
from service.bundles.state import Generation, State
from service.bundles.statefile import save
from service.cli import main
from service.layout import Layout
from service.publish.bundle_status import write_status
from service.status.collect import collect
from service.status.glance import write_heartbeat
from service.status.health import Health
from service.status.view import lines, render_rich
from tests.service.test_status import KERNEL, NEW, OLD, active_bundle, failed_new, host, live

NOON = datetime(2026, 12, 1, 12, 0, tzinfo=UTC).timestamp()


def text(layout: Layout, now: float | None = None) -> str:
    """The plain view of the host."""
    return "\n".join(lines(collect(layout, now=now)))


def test_a_record_from_an_earlier_boot_with_no_module_live_is_failed(tmp_path: Path) -> None:
    """State says active (written in boot-1), nothing is live in boot-2: failed, exit 2."""
    layout = host(tmp_path, State({"nvidia": active_bundle()}, boot_id="boot-1"))
    (layout.sys / "module/nvidia/srcversion").unlink()
    (layout.sys / "module/nvidia/refcnt").unlink()
    (layout.sys / "module/nvidia").rmdir()
    out = io.StringIO()
    assert main(["status", "--root", str(tmp_path)], out) == 2
    assert "module(s) nvidia are not loaded" in out.getvalue()
    assert "modstage boot has not run in this boot (state was written in boot boot-1" in (
        out.getvalue()
    )
    assert "NOT LIVE" in out.getvalue() and "host: FAILED" in out.getvalue()


def test_another_build_live_is_degraded_and_refcnt_is_shown(tmp_path: Path) -> None:
    """A live module with another srcversion than recorded: degraded, both named."""
    layout = host(tmp_path, State({"nvidia": active_bundle()}, boot_id="boot-2"))
    live(layout, "nvidia", "XYZ", refcnt=3)
    doc = collect(layout).to_json()
    assert doc["health"] == "degraded"
    assert "nvidia (srcversion XYZ live, ABC recorded)" in doc["bundles"]["nvidia"]["reasons"][0]
    assert doc["bundles"]["nvidia"]["loaded"][0]["live"]["refcnt"] == 3


def test_a_state_moved_aside_is_failed_and_named(tmp_path: Path) -> None:
    """After boot set a corrupt state aside, status fails (exit 2) naming the set-aside file;
    once rebuilt, it stays degraded until the admin removes that file."""
    layout = host(tmp_path, State({"nvidia": active_bundle()}, boot_id="boot-2"))
    aside = layout.state.with_name("state.json.corrupt-1")
    layout.state.rename(aside)
    out = io.StringIO()
    assert main(["status", "--root", str(tmp_path), "--json"], out) == 2
    doc = json.loads(out.getvalue())
    assert str(aside) in doc["state"]["error"] and doc["health"] == "failed"
    save(layout.state, State({"nvidia": active_bundle()}, boot_id="boot-2"))  # boot rebuilt it
    doc = collect(layout).to_json()
    assert doc["health"] == "degraded" and str(aside) in doc["problems"][0]["reason"]
    aside.unlink()
    assert collect(layout).health is Health.HEALTHY


def test_a_corrupt_state_in_place_names_its_path(tmp_path: Path) -> None:
    """A garbled state.json is reported with its path."""
    layout = host(tmp_path, State())
    layout.state.write_text("{not json")
    assert str(layout.state) in str(collect(layout).state_error)


def test_a_garbled_status_file_is_shown_as_such(tmp_path: Path) -> None:
    """A status file that does not parse makes the bundle degraded, naming the file."""
    layout = host(tmp_path, State({"nvidia": active_bundle()}, boot_id="boot-2"))
    layout.status.mkdir(parents=True)
    (layout.status / "nvidia.json").write_text('{"phase": "rejec')
    (layout.status / "amd.json").write_text("[]")
    doc = collect(layout).to_json()
    assert doc["bundles"]["nvidia"]["health"] == "degraded"
    assert any("nvidia.json is garbled" in r for r in doc["bundles"]["nvidia"]["reasons"])
    assert doc["bundles"]["amd"]["health"] == "degraded"


def test_an_invalid_config_shows_no_defaults(tmp_path: Path) -> None:
    """With an invalid config, backend and window are unknown, not the defaults."""
    layout = host(tmp_path, State({"nvidia": active_bundle()}, boot_id="boot-2"))
    layout.etc.mkdir(parents=True)
    layout.config.write_text('[reboot]\nbackend = "kured"\nstart = "25:00"\n')
    report = collect(layout)
    doc = report.to_json()
    assert doc["reboot"]["backend"] is None and doc["reboot"]["window"] is None
    assert str(layout.config) in doc["config"]["error"] and doc["health"] == "degraded"
    view = "\n".join(lines(report))
    assert f"reboot: unknown: {layout.config} could not be read (reboot.start:" in view
    assert "backend none" not in view


def test_a_pending_generation_for_another_kernel_says_so(tmp_path: Path) -> None:
    """A generation built for the next kernel: 'waiting for kernel X (running Y)'."""
    b = active_bundle().with_generation(Generation(NEW, "2.0", "6.2.0-next", added=200.0))
    layout = host(tmp_path, State({"nvidia": b.move(Phase.PENDING, pending=NEW)}, "boot-2"))
    doc = collect(layout).to_json()
    note = f"waiting for kernel 6.2.0-next (running {KERNEL})"
    assert doc["bundles"]["nvidia"]["waiting"] == note
    assert doc["reboot"]["why_not_asked"] == f"nvidia: {note}"
    assert f"pending [ok] ({note})" in text(layout)


def test_the_window_and_why_no_reboot_was_asked(tmp_path: Path) -> None:
    """A waiting generation outside the window: the next opening, in UTC ISO 8601."""
    b = active_bundle().with_generation(Generation(NEW, "2.0", KERNEL, added=200.0))
    layout = host(tmp_path, State({"nvidia": b.move(Phase.PENDING, pending=NEW)}, "boot-2"))
    layout.etc.mkdir(parents=True)
    layout.config.write_text('[reboot]\nbackend = "kured"\nstart = "02:00"\nend = "04:00"\n')
    write_heartbeat(layout.heartbeat, decision="outside the reboot window", at=NOON - 10)
    doc = collect(layout, now=NOON).to_json()
    assert doc["reboot"]["next_window"] == "2026-12-02T02:00:00Z"
    assert doc["reboot"]["why_not_asked"] == (
        "outside the reboot window; it opens at 2026-12-02T02:00:00Z"
    )
    assert doc["daemon"]["alive"] and doc["daemon"]["age_seconds"] == 10.0
    assert "daemon: alive, last heartbeat 2026-12-01T11:59:50Z (10 s ago)" in text(layout, NOON)
    assert "NOT RESPONDING" in text(layout, NOON + 3600)
    assert not doc["reboot"]["window_open"]
    at_three = NOON - 9 * 3600  # 03:00 UTC, inside the window
    assert collect(layout, now=at_three).reboot.window_open
    assert "every day 02:00:00-04:00:00 UTC, open now" in text(layout, at_three)


def test_backend_none_waits_for_an_admin_and_no_heartbeat_is_said(tmp_path: Path) -> None:
    """Backend none: 'waiting for an admin reboot'; without a daemon: 'no heartbeat'."""
    b = active_bundle().with_generation(Generation(NEW, "2.0", KERNEL, added=200.0))
    b = b.move(Phase.PENDING, pending=NEW).move(Phase.REBOOT_SCHEDULED)
    asked = RebootIntent(NOON, "boot-2", "none", ("nvidia",))
    layout = host(tmp_path, State({"nvidia": b}, boot_id="boot-2", reboot=asked))
    view = text(layout)
    assert "waiting for an admin reboot" in view and "asked via none" not in view
    assert "daemon: no heartbeat" in view


def test_a_failure_is_printed_once_in_utc(tmp_path: Path) -> None:
    """The failure reason appears once in the plain view outside the history (whose entry
    keeps its own note); times are UTC ISO 8601."""
    layout = host(tmp_path, State({"nvidia": failed_new(fallback=True)}, boot_id="boot-2"))
    write_status(layout, "nvidia", failed_new(fallback=True), errors=["ENOKEY: unsigned"])
    view = text(layout)
    moves = [ln for ln in view.splitlines() if " -> " in ln]
    others = [ln for ln in view.splitlines() if ln not in moves]
    assert "\n".join(others).count("ENOKEY: unsigned") == 1, view
    assert [ln for ln in moves if ln.endswith("loading -> failed: ENOKEY: unsigned")], view
    assert "added 1970-01-01T00:01:40Z" in view


def test_rich_view_never_shows_node_none(tmp_path: Path) -> None:
    """A memory block without a node shows '-' in the rich table, never 'None'."""
    layout = host(tmp_path, State({"nvidia": active_bundle()}, boot_id="boot-2"))
    block = layout.sys / "devices/system/memory/memory3"
    block.mkdir(parents=True)
    (block / "state").write_text("offline\n")
    out = io.StringIO()
    render_rich(collect(layout), out)
    assert "None" not in out.getvalue() and OLD[:12] in out.getvalue()


def test_the_daemon_refreshes_its_heartbeat(tmp_path: Path) -> None:
    """The daemon's loop writes the heartbeat with its reboot decision; status shows it alive."""
    from service.config import Config
    from service.daemon.events import Event, Kind
    from service.daemon.loop import Daemon
    from service.rebooting.request import NoRebooter

    b = active_bundle().with_generation(Generation(NEW, "2.0", KERNEL, added=200.0))
    layout = host(tmp_path, State({"nvidia": b.move(Phase.PENDING, pending=NEW)}, "boot-2"))
    daemon = Daemon(layout, Config(), _NoIntake(), NoRebooter())  # type: ignore[arg-type]
    thread = threading.Thread(target=daemon.loop, daemon=True)
    thread.start()
    deadline = time.monotonic() + 10
    while not layout.heartbeat.exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    daemon.events.put(Event(Kind.STOP))
    thread.join(5)
    beat = json.loads(layout.heartbeat.read_text())
    assert beat["reboot_decision"] == "requested"
    doc = collect(layout).to_json()
    assert doc["daemon"]["alive"]
    note = doc["bundles"]["nvidia"]["history"][-1]["note"]
    assert note == "waiting for an admin reboot (backend none)"


class _NoIntake:
    """An intake with no drops."""

    def run(self) -> list[object]:
        return []


def test_a_held_bundle_is_marked_and_its_heartbeat_age_is_a_metric(tmp_path: Path) -> None:
    """A held bundle shows HELD and why no reboot is asked; the heartbeat's age is a metric."""
    from service.status.metrics import families

    b = active_bundle().with_generation(Generation(NEW, "2.0", KERNEL, added=200.0))
    b = verbs.hold(b.move(Phase.PENDING, pending=NEW))
    layout = host(tmp_path, State({"nvidia": b}, boot_id="boot-2"))
    write_heartbeat(layout.heartbeat, decision="no generation waits for a reboot", at=NOON - 5)
    doc = collect(layout, now=NOON)
    assert "HELD" in "\n".join(lines(doc))
    assert doc.reboot.why_not_asked == (
        "nvidia: held by an admin: no reboot is asked (modstage release)"
    )
    ages = {f.name: f.samples for f in families(doc)}["modstage_daemon_heartbeat_age_seconds"]
    assert ages == [({}, 5.0)]

"""Planned work is not a failure: a bundle whose driver was unloaded for a pending
generation is ``upgrading`` (exit code 4) until the reboot, and failed only past its bound;
an unload nothing planned explains stays a failure. Judged by ``status`` on a temporary
host tree (state, sysfs, the daemon's unload record, the operator's readiness file)."""

from __future__ import annotations

import io
import json
from dataclasses import replace
from datetime import UTC, datetime, time
from pathlib import Path
from types import SimpleNamespace

import pytest

from service.bundles.phase import Phase
from service.bundles.records import ModuleLoad
from service.bundles.state import BundleState, Generation, State
from service.bundles.statefile import save
from service.cli import main
from service.config import Config
from service.rebooting.window import Window
from service.status import survey
from service.status.collect import collect
from service.status.health import Health
from service.status.metrics import families
from service.status.report import Report
from service.status.unloads import read_unloads, updated, write_unloads
from service.status.upgrade import DRIVER_POD_READY, DROP_GRACE
from service.status.view import lines
from tests.hosts import running_host

KERNEL = "6.1.0-test-amd64"
BOOT = "boot-1"
V1, V2 = "a" * 64, "b" * 64
MODULES = ("nvidia", "nvidia_modeset", "nvidia_uvm")
# Monday 2026-11-30 05:01 UTC: the window below has just closed
T0 = datetime(2026, 11, 30, 5, 1, tzinfo=UTC).timestamp()
WINDOW = '[reboot]\nbackend = "kured"\ndays = ["mon"]\nstart = "02:00"\nend = "05:00"\n'
HOUR = 3600.0


def _timed(bundle: BundleState, at: float) -> BundleState:
    """``bundle`` with its newest history entry at ``at`` (the transitions stamp the
    wall clock)."""
    last = replace(bundle.history[-1], at=at)
    return replace(bundle, history=(*bundle.history[:-1], last))


class Node:
    """A node whose v1 went live at T0, with the operator's driver pod ready on it."""

    def __init__(self, root: Path, config: str = WINDOW, *, operator: bool = True) -> None:
        self.layout = layout = running_host(root, KERNEL, BOOT)
        layout.config.parent.mkdir(parents=True, exist_ok=True)
        layout.config.write_text(config)
        loaded = tuple(ModuleLoad(m, f"S{m}") for m in MODULES)
        b = BundleState().with_generation(Generation(V1, "1.0", KERNEL, added=T0 - 60))
        b = _timed(b.move(Phase.PENDING, pending=V1), T0 - 60)
        b = _timed(b.move(Phase.LOADING), T0 - 1)
        self.bundle = _timed(b.move(Phase.ACTIVE, active=V1, pending=None, loaded=loaded), T0)
        self._save()
        for m in MODULES:
            (layout.sys / "module" / m).mkdir(parents=True)
            (layout.sys / "module" / m / "srcversion").write_text(f"S{m}\n")
        self.ready = layout.host(DRIVER_POD_READY)
        if operator:
            self.ready.parent.mkdir(parents=True)
            self.ready.write_text("")

    def _save(self) -> None:
        save(self.layout.state, State({"nvidia": self.bundle}, boot_id=BOOT))

    def pod_replaced(self) -> None:
        """The old driver pod's preStop removed the readiness file."""
        self.ready.unlink()

    def unload(self, at: float, *, seen: bool = True) -> None:
        """The modules leave the kernel at ``at`` (recorded, as the daemon records the
        kernel's ``remove`` uevents, when ``seen``)."""
        for m in MODULES:
            for f in (self.layout.sys / "module" / m).iterdir():
                f.unlink()
            (self.layout.sys / "module" / m).rmdir()
        if seen:
            changes = [("remove", m) for m in MODULES]
            write_unloads(self.layout.unloads, BOOT, updated({}, changes, at))

    def drop(self, at: float, version: str = "2.0") -> None:
        """The new driver pod's drop is taken in at ``at``: v2 pending."""
        gen = Generation(V2, version, KERNEL, added=at)
        self.bundle = _timed(self.bundle.staged(gen, retain=3), at)
        self._save()

    def drop_again(self, at: float) -> None:
        """The same v1 dropped again for a new digest: v1 pending once more."""
        self.bundle = _timed(self.bundle.reloading(V1), at)
        self._save()

    def status(self, now: float) -> Report:
        return collect(self.layout, now=now)


def test_a_driver_unloaded_for_a_pending_generation_is_upgrading(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """v1 unloaded by the new pod's init container (the daemon saw it), v2's drop taken in
    30 s later: an hour on, the bundle and the host are upgrading, exit code 4, the line
    says how long the node has been without its driver, when it becomes a failure, and the
    reboot it waits for on the same line; ``--json`` says the same at the same moment (the
    command's wall clock is pinned there: the recorded times are fixed dates)."""
    node = Node(tmp_path)
    node.pod_replaced()
    node.unload(T0 + HOUR)
    node.drop(T0 + HOUR + 30)
    report = node.status(T0 + 2 * HOUR)
    b = report.bundles["nvidia"]
    assert (report.health, b.health, report.exit_code) == (Health.UPGRADING, Health.UPGRADING, 4)
    assert b.upgrading is not None and b.upgrading.unload_seen and not b.upgrading.expired
    assert (b.upgrading.to, b.upgrading.version, b.upgrading.seconds) == (V2, "2.0", HOUR)
    problem = next(line for line in lines(report) if line.startswith("  ! nvidia:"))
    assert "upgrading: module(s) nvidia, nvidia_modeset, nvidia_uvm unloaded" in problem
    assert "pending generation bbbbbbbbbbbb (2.0)" in problem
    assert "without its driver for 1 h 0 min" in problem
    assert "failed if the reboot has not come within 6 d 23 h 1 min" in problem
    assert "; reboot: required for nvidia" in problem and "backend kured" in problem
    assert "FAILED" not in "\n".join(lines(report))
    out = io.StringIO()
    monkeypatch.setattr(survey, "time", SimpleNamespace(time=lambda: T0 + 2 * HOUR))
    rc = main(["status", "--root", str(tmp_path), "--json"], out)
    doc = json.loads(out.getvalue())
    assert rc == 4 and doc["exit_code"] == 4 and doc["health"] == "upgrading"
    assert doc["bundles"]["nvidia"]["upgrading"]["to"] == V2


def test_the_same_generation_dropped_again_for_a_new_digest_is_upgrading(tmp_path: Path) -> None:
    """The digest-only path: the init container unloads v1, the pod drops v1 again, the
    host makes it pending once more; until the reboot that is an upgrade too."""
    node = Node(tmp_path)
    node.pod_replaced()
    node.unload(T0 + HOUR)
    node.drop_again(T0 + HOUR + 20)
    b = node.status(T0 + HOUR + 60).bundles["nvidia"]
    assert b.health is Health.UPGRADING and b.upgrading is not None
    assert (b.upgrading.to, b.upgrading.version) == (V1, "1.0")


def test_an_unload_with_nothing_pending_is_a_failure(tmp_path: Path) -> None:
    """Someone ran ``rmmod`` while the driver pod runs (its readiness file is there) and
    nothing is pending: failed at once, exit code 2, as before."""
    node = Node(tmp_path)
    node.unload(T0 + HOUR)
    report = node.status(T0 + HOUR + 1)
    assert report.health is Health.FAILED and report.exit_code == 2
    assert report.bundles["nvidia"].upgrading is None
    assert any(
        "are not loaded in the running kernel" in r for r in report.bundles["nvidia"].reasons
    )


def test_the_minutes_before_the_drop_are_upgrading_then_a_failure(tmp_path: Path) -> None:
    """The old pod's preStop removed the readiness file and the init container unloaded
    the driver; the new pod's drop has not come: upgrading for DROP_GRACE after the
    unload the daemon saw, a failure after that."""
    node = Node(tmp_path)
    node.pod_replaced()
    node.unload(T0 + HOUR)
    early = node.status(T0 + HOUR + 120).bundles["nvidia"]
    assert early.health is Health.UPGRADING and early.upgrading is not None
    assert early.upgrading.to is None
    assert "its drop has not come in yet" in early.reasons[0]
    late = node.status(T0 + HOUR + DROP_GRACE + 1).bundles["nvidia"]
    assert late.health is Health.FAILED and "the drop never came" in late.reasons[0]


def test_no_grace_without_a_seen_unload_or_on_a_host_without_the_operator(tmp_path: Path) -> None:
    """The grace needs both the daemon's record of the unload and the operator's
    readiness file gone: an unseen unload, or a host with no operator, is a failure."""
    unseen = Node(tmp_path / "unseen")
    unseen.pod_replaced()
    unseen.unload(T0 + HOUR, seen=False)
    assert unseen.status(T0 + HOUR + 60).health is Health.FAILED
    plain = Node(tmp_path / "plain", operator=False)
    plain.unload(T0 + HOUR)
    assert plain.status(T0 + HOUR + 60).health is Health.FAILED


def test_a_pending_generation_older_than_the_live_one_explains_nothing(tmp_path: Path) -> None:
    """A pending generation recorded before the active one went live (it waited, and v1
    came up again) is no upgrade under way: its modules missing is a failure."""
    node = Node(tmp_path)
    node.drop(T0 + 60)
    b = _timed(node.bundle.move(Phase.LOADING), T0 + 120)
    node.bundle = _timed(b.move(Phase.ACTIVE), T0 + 180)  # v1 up again, v2 still pending
    node._save()
    node.unload(T0 + HOUR)
    assert node.status(T0 + HOUR + 60).health is Health.FAILED


def test_a_pending_generation_that_failed_explains_nothing(tmp_path: Path) -> None:
    """A pending generation that already failed will not load: no upgrade is under way."""
    node = Node(tmp_path)
    node.pod_replaced()
    node.unload(T0 + HOUR)
    node.drop(T0 + HOUR + 30)
    gen = replace(node.bundle.generations[V2], failed="ENOKEY")
    node.bundle = node.bundle.with_generation(gen)
    node._save()
    assert node.status(T0 + HOUR + 60).bundles["nvidia"].health is Health.FAILED


def test_a_closed_window_never_pages_and_past_the_bound_it_is_a_failure(tmp_path: Path) -> None:
    """With a Monday 02:00-05:00 window, an upgrade that starts as the window closes waits
    almost a week for it: upgrading all that time (the bound is the longest closed
    stretch, 165 h, plus min_delay and 2 h), failed once past the bound."""
    node = Node(tmp_path)
    node.pod_replaced()
    node.unload(T0)
    node.drop(T0 + 30)
    bound = Config.load(node.layout.config).reboot.upgrading_limit()
    assert bound == 165 * HOUR + 60 + 2 * HOUR
    week = node.status(T0 + 165 * HOUR)
    assert week.health is Health.UPGRADING and week.exit_code == 4
    past = node.status(T0 + bound + 1)
    assert past.health is Health.FAILED and past.exit_code == 2
    reason = past.bundles["nvidia"].reasons[0]
    assert "the upgrade to 2.0 has lasted past its bound of 6 d 23 h 1 min" in reason
    assert past.bundles["nvidia"].upgrading is not None
    assert past.bundles["nvidia"].upgrading.expired


def test_the_admin_sets_the_bound(tmp_path: Path) -> None:
    """``[reboot] upgrading_bound`` replaces the default: 10 minutes here."""
    node = Node(tmp_path, WINDOW + "upgrading_bound = 600\n")
    node.pod_replaced()
    node.unload(T0)
    node.drop(T0 + 30)
    assert node.status(T0 + 599).health is Health.UPGRADING
    assert node.status(T0 + 601).health is Health.FAILED


def test_an_unload_the_daemon_did_not_see_counts_from_the_drop(tmp_path: Path) -> None:
    """Without the daemon's record the time counts from the pending generation's record,
    and the line says "at least"."""
    node = Node(tmp_path)
    node.pod_replaced()
    node.unload(T0 + HOUR, seen=False)
    node.drop(T0 + 2 * HOUR)
    b = node.status(T0 + 3 * HOUR).bundles["nvidia"]
    assert b.health is Health.UPGRADING and b.upgrading is not None
    assert not b.upgrading.unload_seen and b.upgrading.seconds == HOUR
    assert "without its driver for at least 1 h 0 min" in b.reasons[0]


def test_worse_findings_still_win(tmp_path: Path) -> None:
    """Upgrading is better than degraded: a garbled status file beside an upgrade makes the
    host degraded (exit 1), never healthy."""
    node = Node(tmp_path)
    node.pod_replaced()
    node.unload(T0)
    node.drop(T0 + 30)
    node.layout.status.mkdir(parents=True, exist_ok=True)
    (node.layout.status / "nvidia.json").write_text("{")
    report = node.status(T0 + 60)
    assert report.health is Health.DEGRADED and report.exit_code == 1
    assert report.bundles["nvidia"].upgrading is not None
    graded = {p.reason.split(":")[0]: p.health for p in report.problems}
    assert graded["upgrading"] is Health.UPGRADING  # each problem keeps its own grade
    problem = next(ln for ln in lines(report) if ln.startswith("  ! nvidia: upgrading"))
    assert "; reboot: " in problem


def test_the_metrics_carry_the_grade_and_the_driverless_time(tmp_path: Path) -> None:
    """One grade series per health, 1 for the current one; the driver-less seconds and the
    bound while upgrading; ``modstage_health`` is the exit code (4)."""
    node = Node(tmp_path)
    node.pod_replaced()
    node.unload(T0)
    node.drop(T0 + 30)
    fams = {f.name: f.samples for f in families(node.status(T0 + 90))}
    grades = {s[0]["health"]: s[1] for s in fams["modstage_bundle_grade"]}
    assert grades == {"healthy": 0.0, "upgrading": 1.0, "degraded": 0.0, "failed": 0.0}
    assert fams["modstage_health"] == [({}, 4.0)]
    assert fams["modstage_bundle_driverless_seconds"] == [({"bundle": "nvidia"}, 90.0)]
    limit = fams["modstage_bundle_upgrading_limit_seconds"][0][1]
    assert limit == 167 * HOUR + 60


def test_the_windows_longest_closed_stretch() -> None:
    """Read from the days and hours: always open is 0, a daily 02-05 window 21 h, one that
    spans midnight on weekdays the weekend (Friday's close to Monday's open)."""
    assert Window().longest_closed() == 0
    assert Window(start=time(2), end=time(5)).longest_closed() == 21 * HOUR
    weekdays = ("mon", "tue", "wed", "thu", "fri")
    assert Window(weekdays, time(22), time(4)).longest_closed() == 66 * HOUR
    assert Window(("sat",), time(2), time(4)).longest_closed() == 166 * HOUR


def test_the_unload_record_is_per_boot_and_a_module_back_is_forgotten(tmp_path: Path) -> None:
    """A ``remove`` records the time, a later ``add`` forgets it; a record from another boot
    or an unreadable one is empty."""
    path = tmp_path / "unloads.json"
    record = updated({}, [("remove", "nvidia"), ("remove", "nvidia_uvm"), ("add", "nvidia")], 5.0)
    assert record == {"nvidia_uvm": 5.0}
    write_unloads(path, BOOT, record)
    assert read_unloads(path, BOOT) == {"nvidia_uvm": 5.0}
    assert read_unloads(path, "another-boot") == {}
    path.write_text("{")
    assert read_unloads(path, BOOT) == {}

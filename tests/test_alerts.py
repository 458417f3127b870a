"""deploy/prometheus/modstage-alerts.yml, tested with promtool (Debian's prometheus package)
against the series modstage itself writes through a driver upgrade: a planned upgrade that
waits a whole closed window for its reboot never pages; an upgrade stuck past its bound,
and an unload nothing planned explains, page; a daemon that stopped writing is flagged.

Each node's series are modstage's own metrics (``service.status.metrics.families`` over
``status`` of a temporary host tree), sampled every 5 minutes as the daemon rewrites them.
What must fire, and when, comes from the scenario and the config's bound, not from them."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from service.bundles.phase import Phase
from service.config import Config
from service.status.health import Health
from service.status.metrics import families
from tests.service.test_upgrading import HOUR, T0, V2, Node, _timed

pytestmark = pytest.mark.debian  # promtool from Debian's prometheus package

ROOT = Path(__file__).resolve().parents[1]
RULES = ROOT / "deploy/prometheus/modstage-alerts.yml"
STEP = 300.0  # the daemon's periodic scan rewrites the textfile at least this often
DAILY = '[reboot]\nbackend = "kured"\nstart = "02:00"\nend = "05:00"\n'  # T0: just closed
SPAN = 26 * HOUR
UNLOAD = 1 * HOUR
REBOOT = 22 * HOUR  # the next day's window (Tuesday 02:00 is T0 + 20 h 59 min)
DAEMON_STOPS = 2 * HOUR
FOR = {"ModstageFailed": 5 * 60}


def promtool() -> str:
    """promtool: ``$MODSTAGE_PROMTOOL``, the one .ci/install extracts, or on the PATH."""
    cache = Path(os.environ.get("MODSTAGE_TEST_CACHE") or Path.home() / ".cache/modstage-test")
    for found in (
        os.environ.get("MODSTAGE_PROMTOOL"),
        str(cache / "prometheus/usr/bin/promtool"),
        shutil.which("promtool"),
    ):
        if found and os.access(found, os.X_OK):
            return found
    pytest.fail("promtool not found: run .ci/install (it extracts Debian's prometheus package)")


class Path_:
    """One node's path through the scenario and what modstage reports at each sample."""

    def __init__(self, root: Path, name: str) -> None:
        self.name = name
        self.node = Node(root / name, DAILY)
        self.grades: list[Health] = []

    def at(self, t: float) -> None:
        """Move the node to time ``t`` of the scenario, then sample its metrics."""
        now = T0 + t
        if t == UNLOAD and self.name != "dead":
            if self.name != "rmmod":
                self.node.pod_replaced()
            self.node.unload(now)
            if self.name != "rmmod":
                self.node.drop(now + 30)
        if t == REBOOT and self.name == "upgrade":
            self.reboot(now)
        fams = {f.name: f.samples for f in families(self.node.status(now))}
        grade = next(s[0]["health"] for s in fams["modstage_grade"] if s[1] == 1.0)
        self.grades.append(Health[grade.upper()])

    def reboot(self, now: float) -> None:
        """The node rebooted into v2: boot loaded it, the unload record (on /run) is gone."""
        b = _timed(self.node.bundle.move(Phase.LOADING), now - 30)
        self.node.bundle = _timed(b.move(Phase.ACTIVE, active=V2, pending=None), now)
        self.node._save()
        for m in self.node.bundle.loaded:
            (self.node.layout.sys / "module" / m.module).mkdir(parents=True)
            srcversion = self.node.layout.sys / "module" / m.module / "srcversion"
            srcversion.write_text(f"{m.srcversion}\n")
        self.node.layout.unloads.unlink()

    def series(self) -> list[dict[str, str]]:
        """promtool's input series: the grade, one series per health, and the textfile's
        modification time (the daemon rewrites it every sample, until a dead one stops)."""
        out = []
        for health in Health:
            values = " ".join("1" if g is health else "0" for g in self.grades)
            labels = f'instance="{self.name}",health="{health.label}"'
            out.append({"series": f"modstage_grade{{{labels}}}", "values": values})
        written = [
            str(int(min(i * STEP, DAEMON_STOPS) if self.name == "dead" else i * STEP))
            for i in range(len(self.grades))
        ]
        textfile = "/var/lib/prometheus/node-exporter/modstage.prom"
        labels = f'instance="{self.name}",file="{textfile}"'
        out.append(
            {"series": f"node_textfile_mtime_seconds{{{labels}}}", "values": " ".join(written)}
        )
        return out


def _promtool_test(doc: dict[str, object], spec: Path) -> None:
    """Write ``doc`` (a promtool rule test) to ``spec`` and run it; it must succeed."""
    spec.write_text(yaml.safe_dump(doc, sort_keys=False))
    run = subprocess.run(
        [promtool(), "test", "rules", str(spec)], capture_output=True, text=True, timeout=300
    )
    assert run.returncode == 0, run.stdout + run.stderr
    assert "SUCCESS" in run.stdout


def _alert(name: str, instance: str) -> dict[str, object]:
    if name == "ModstageFailed":
        return {
            "exp_labels": {"instance": instance, "health": "failed", "severity": "critical"},
            "exp_annotations": {
                "summary": f"modstage on {instance}: failed",
                "description": "Run `modstage status` on the node: it names the bundle and "
                "the reason.",
            },
        }
    return {
        "exp_labels": {
            "instance": instance,
            "file": "/var/lib/prometheus/node-exporter/modstage.prom",
            "severity": "warning",
        },
        "exp_annotations": {
            "summary": f"modstage on {instance}: its metrics are stale",
            "description": "The modstage daemon is not running: `systemctl status modstage`.",
        },
    }


def test_alerts_page_on_failures_never_on_a_planned_upgrade(tmp_path: Path) -> None:
    """Over 26 hours: ``upgrade`` (its driver unloaded for v2 at 1 h, the reboot in the
    next day's window at 22 h) never pages; ``stuck`` (the same, never rebooted) pages
    once past the bound (the window's 21 h closed stretch + min_delay + 2 h after its
    unload); ``rmmod`` (unloaded with nothing pending) pages from its unload on; ``dead``
    (its daemon stops writing at 2 h) is flagged stale 15 minutes on, and none other is."""
    bound = Config.load(Node(tmp_path / "probe", DAILY).layout.config).reboot.upgrading_limit()
    assert bound == 21 * HOUR + 60 + 2 * HOUR
    paths = [Path_(tmp_path, n) for n in ("upgrade", "stuck", "rmmod", "dead")]
    for i in range(int(SPAN / STEP) + 1):
        for p in paths:
            p.at(i * STEP)
    by = {p.name: p for p in paths}
    assert Health.FAILED not in by["upgrade"].grades and Health.UPGRADING in by["upgrade"].grades
    assert by["upgrade"].grades[-1] is Health.HEALTHY

    fails_from = {"rmmod": UNLOAD, "stuck": UNLOAD + bound}
    tests = []
    for hour in range(int(SPAN // HOUR) + 1):
        t = hour * HOUR
        failing = [
            n for n, since in fails_from.items() if t >= since + STEP + FOR["ModstageFailed"]
        ]
        stale = ["dead"] if t >= DAEMON_STOPS + 15 * 60 + 5 * 60 + STEP else []
        tests.append(
            {
                "eval_time": f"{hour}h",
                "alertname": "ModstageFailed",
                "exp_alerts": [_alert("ModstageFailed", n) for n in sorted(failing)],
            }
        )
        tests.append(
            {
                "eval_time": f"{hour}h",
                "alertname": "ModstageMetricsStale",
                "exp_alerts": [_alert("ModstageMetricsStale", n) for n in stale],
            }
        )
    doc = {
        "rule_files": [str(RULES)],
        "evaluation_interval": "1m",
        "tests": [
            {
                "interval": f"{int(STEP)}s",
                "input_series": [s for p in paths for s in p.series()],
                "alert_rule_test": tests,
            }
        ],
    }
    _promtool_test(doc, tmp_path / "alerts-test.yml")


def test_a_next_kernel_without_the_driver_warns_after_an_hour(tmp_path: Path) -> None:
    """A node whose next boot runs a kernel ``nvidia`` has no generation for (modstage's own
    metrics of such a host, sampled every 5 minutes for 3 hours) gets
    ``ModstageNextKernelWithoutDriver`` (warning, naming bundle and kernel) once the gap has
    lasted an hour, and not before; a node whose driver for that kernel is pending gets none."""
    from service.bundles.state import Generation, State
    from service.status.collect import collect
    from tests.service.test_reboot_required import NEW, NEXT, active, updated

    covered = active().with_generation(Generation(NEW, "2.0", NEXT, added=2.0))
    nodes = {
        "gap": updated(tmp_path / "gap", State({"nvidia": active()})),
        "ready": updated(
            tmp_path / "ready", State({"nvidia": covered.move(Phase.PENDING, pending=NEW)})
        ),
    }
    samples = int(3 * HOUR / STEP) + 1
    series = []
    for name, layout in nodes.items():
        fams = {f.name: f.samples for f in families(collect(layout))}
        for labels, value in fams["modstage_bundle_next_kernel_missing"]:
            text = ",".join(f'{k}="{v}"' for k, v in {"instance": name, **labels}.items())
            series.append(
                {
                    "series": f"modstage_bundle_next_kernel_missing{{{text}}}",
                    "values": " ".join([str(int(value))] * samples),
                }
            )
    fired = {
        "exp_labels": {
            "instance": "gap",
            "bundle": "nvidia",
            "kernel": NEXT,
            "severity": "warning",
        },
        "exp_annotations": {
            "summary": f"modstage on gap: no nvidia for kernel {NEXT}",
            "description": f"Stage the bundle for kernel {NEXT}: `modstage status` says how "
            "long the reboot is held.",
        },
    }
    tests = [
        {"eval_time": f"{m}m", "alertname": "ModstageNextKernelWithoutDriver", "exp_alerts": exp}
        for m, exp in ((55, []), (65, [fired]), (170, [fired]))
    ]
    doc = {
        "rule_files": [str(RULES)],
        "evaluation_interval": "1m",
        "tests": [{"interval": f"{int(STEP)}s", "input_series": series, "alert_rule_test": tests}],
    }
    _promtool_test(doc, tmp_path / "next-kernel-test.yml")

"""The daemon never imports the verify stack: intake runs in a child, the metrics read no
signers (a set check in a fresh interpreter, not a timing)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from prometheus_client.parser import text_string_to_metric_families

from service.bundles.phase import Phase
from service.bundles.statefile import load
from service.status.collect import collect
from service.status.metrics import families, render
from service.status.survey import survey
from stager.drop import ModuleSpec, stage
from tests.service.conftest import HostTree

ROOT = Path(__file__).resolve().parents[2]
#: One daemon scan of the sandbox root in argv[1]: the drop taken in by the child intake,
#: the next kernel announced, the metrics written, a reboot decided (not yet due so soon
#: after a drop); then every
#: ``service.verify`` module the daemon's interpreter holds.
PROBE = """
import json, sys
from pathlib import Path
from service.config import Config
from service.daemon.events import Event, Kind
from service.daemon.intake_runner import ChildIntake
from service.daemon.loop import Daemon
from service.daemon.timers import Timers
from service.layout import Layout
from service.rebooting.request import NoRebooter
layout = Layout(Path(sys.argv[1]))
config = Config()
daemon = Daemon(layout, config, ChildIntake(layout, config), NoRebooter(), debounce=0.0)
daemon.reconcile()
daemon.step([Event(Kind.DROP)], Timers.start(daemon.clock.monotonic(), 300.0, None))
print(json.dumps(sorted(m for m in sys.modules if m.startswith("service.verify"))))
"""


def test_a_daemon_scan_imports_no_verify_module(
    host_tree: HostTree, module: Path, kernel: str
) -> None:
    """After a scan that took a drop in and wrote the metrics (naming the bundle, its
    signer known to the store), the daemon's ``sys.modules`` holds no ``service.verify``
    module: verification ran in the child, the metrics read no certificate or signature."""
    layout = host_tree()
    stage(layout.incoming, bundle="b", version="1", kernel=kernel, modules=[ModuleSpec(module)])
    done = subprocess.run(
        [sys.executable, "-c", PROBE, str(layout.root)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
        timeout=120,
    )
    assert load(layout.state).bundle("b").phase is Phase.PENDING, done.stderr
    assert 'modstage_bundle_phase{bundle="b",phase="pending"} 1.0' in (layout.metrics.read_text())
    assert json.loads(done.stdout.splitlines()[-1]) == [], done.stderr


def test_the_metrics_from_the_survey_equal_those_from_the_full_status(
    host_tree: HostTree, module: Path, kernel: str
) -> None:
    """The metrics written from the survey without signers are, sample for sample, those
    of the full ``status`` collection (which names the signers) of the same host."""
    layout = host_tree()
    stage(layout.incoming, bundle="b", version="1", kernel=kernel, modules=[ModuleSpec(module)])
    subprocess.run(
        [sys.executable, "-m", "service.cli", "intake", "--root", str(layout.root)],
        cwd=ROOT,
        check=True,
        capture_output=True,
    )
    full = collect(layout, now=1000.0)
    assert full.bundles["b"].signers, "the full collection names the signer"
    narrow = survey(layout, now=1000.0)
    assert not narrow.bundles["b"].signers

    def parsed(text: bytes) -> list[tuple[str, dict[str, str], float]]:
        return [
            (s.name, s.labels, s.value)
            for fam in text_string_to_metric_families(text.decode())
            for s in fam.samples
        ]

    seconds = {"b": 0.25}
    assert parsed(render(families(narrow, seconds))) == parsed(render(families(full, seconds)))
    assert len(parsed(render(families(narrow, seconds)))) > 20

"""Intake in a child process (``modstage serve``'s intake): same outcomes, a daemon kept small."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from service.bundles.phase import Phase
from service.bundles.statefile import load
from service.cmd.intake_child import ticker
from service.config import Config
from service.daemon.intake_protocol import TICK, ChildResult
from service.daemon.intake_runner import ChildIntake, child_env, has_work
from service.errors import ServiceError, StateCorrupt
from service.intake.outcome import Outcome
from service.layout import Layout
from stager.drop import ModuleSpec, stage

ROOT = Path(__file__).resolve().parents[2]


def _work(host: Layout) -> None:
    """Something in the trash: work for a child (a stand-in child here)."""
    (host.trash / "b.00000000000000000001.ab").mkdir(parents=True, exist_ok=True)


def _printing(doc: object) -> tuple[str, ...]:
    """A stand-in interpreter whose "child" prints one ticks line and ``doc``, then exits 1."""
    line = json.dumps(doc)
    return (sys.executable, "-c", f"print('tick'); print({line!r}); raise SystemExit(1)")


def test_child_takes_a_drop_in_and_relays_its_progress(
    host: Layout, module: Path, kernel: str
) -> None:
    """A good drop taken in by the child is pending in state.json, its outcome read back
    whole, the drop gone, and the child's progress reached the daemon's tick."""
    ticks: list[int] = []
    runner = ChildIntake(host, Config(), tick=lambda: ticks.append(1))
    drop = stage(
        host.incoming, bundle="b", version="1", kernel=kernel, modules=[ModuleSpec(module)]
    )
    [outcome] = runner.run()
    assert outcome.accepted and outcome.bundle == "b" and outcome.drop == drop
    assert outcome.seconds is not None and outcome.seconds > 0
    bundle = load(host.state).bundle("b")
    assert bundle.phase is Phase.PENDING and bundle.pending == outcome.generation
    assert not drop.exists()
    assert ticks, "no progress relayed"


def test_a_scan_without_work_starts_no_child(host: Layout, module: Path, kernel: str) -> None:
    """A scan that finds no complete drop, no trash and nothing a crash left in the store
    starts no child (an interpreter that cannot start proves it); one with a drop does."""
    runner = ChildIntake(host, Config(), python=("/nonexistent/python",))
    (host.incoming / "b.00000000000000000001.ab").mkdir()  # incomplete: no manifest
    assert not has_work(host, Config())
    assert runner.run() == [] and runner.run() == []
    stage(host.incoming, bundle="b", version="1", kernel=kernel, modules=[ModuleSpec(module)])
    assert has_work(host, Config())
    with pytest.raises(FileNotFoundError):
        runner.run()


def test_what_a_killed_intake_left_starts_a_child_after_a_start(host: Layout) -> None:
    """A temporary directory left in the store makes the first scan after a start (or after
    a failed child) start a child, which cleans it; later scans do not look again."""
    host.store.mkdir(parents=True, exist_ok=True)
    (host.store / ".tmp-0123456789abcdef").mkdir()
    runner = ChildIntake(host, Config(), python=("/nonexistent/python",))
    with pytest.raises(FileNotFoundError):
        runner.run()
    runner.python = (sys.executable,)
    assert runner.run() == []
    assert list(host.store.iterdir()) == []
    runner.python = ("/nonexistent/python",)
    (host.store / ".tmp-fedcba9876543210").mkdir()
    assert runner.run() == []  # not looked at again: only a crash leaves these


def test_trash_left_behind_is_work(host: Layout) -> None:
    """A drop left in the trash (a daemon killed while removing it) makes the next scan work."""
    assert not has_work(host, Config())
    (host.trash / "b.00000000000000000001.ab").mkdir(parents=True)
    assert has_work(host, Config())


def test_a_child_without_a_result_is_a_service_error(host: Layout) -> None:
    """A child that dies without its result line (killed, crashed) is an error naming its
    exit code, and the next scan starts a child again even without work."""
    _work(host)
    runner = ChildIntake(host, Config(), python=(sys.executable, "-c", "raise SystemExit(3)"))
    with pytest.raises(ServiceError, match="exited with 3 and no result"):
        runner.run()
    assert not runner.started_once
    runner.python = _printing({"outcomes": []})
    assert runner.run() == []


def test_the_childs_errors_come_back_as_their_kind(host: Layout) -> None:
    """A corrupt state the child found is a StateCorrupt in the daemon (it rebuilds the state
    from it), built from the same fields (nothing parsed back out of its message); any other
    failure a ServiceError saying what failed; a malformed result line a ServiceError too."""
    _work(host)
    corrupt = StateCorrupt(host.state, f"{host.state}.corrupt-1", "Expecting value")
    result = ChildResult.failed(corrupt, str(corrupt)).to_json()
    runner = ChildIntake(host, Config(), python=_printing(result))
    with pytest.raises(StateCorrupt) as caught:
        runner.run()
    assert str(caught.value) == str(corrupt) and caught.value.aside == corrupt.aside
    assert caught.value.reason == "Expecting value"
    runner.python = _printing({"error": "x", "corrupt": [str(host.state), corrupt.aside]})
    with pytest.raises(ServiceError, match="exited with 1 and no result"):
        runner.run()
    runner.python = _printing({"error": "disk full", "corrupt": None})
    with pytest.raises(ServiceError, match=r"intake \(child process\): disk full"):
        runner.run()


def test_outcome_survives_its_json_form(tmp_path: Path) -> None:
    """Every field of an outcome comes back equal through the child's JSON line."""
    outcome = Outcome(tmp_path / "d", "b", None, False, ("why", "more"), True, 1.5, False)
    assert Outcome.from_json(json.loads(json.dumps(outcome.to_json()))) == outcome


def test_child_env_keeps_systemd_for_the_daemon(tmp_path: Path) -> None:
    """The child neither inherits the notify socket nor the watchdog (systemd would take its
    messages for the daemon's), and runs the daemon's own copy of the code."""
    env = child_env({"NOTIFY_SOCKET": "/run/n", "WATCHDOG_USEC": "1", "PATH": "/bin"})
    assert "NOTIFY_SOCKET" not in env and "WATCHDOG_USEC" not in env and env["PATH"] == "/bin"
    assert env["PYTHONPATH"].split(":")[0] == str(ROOT)


def test_ticker_writes_at_most_once_per_interval(tmp_path: Path) -> None:
    """Progress lines are rate-limited: a thousand ticks in a burst write one line."""
    with (tmp_path / "out").open("wb") as out:
        tick = ticker(out, every=60)
        for _ in range(1000):
            tick()
    assert (tmp_path / "out").read_bytes() == TICK


def test_daemon_process_never_imports_the_verify_stack(
    host: Layout, module: Path, kernel: str
) -> None:
    """The daemon's modules and a whole intake through the child leave cryptography,
    asn1crypto and service.verify out of the daemon's process."""
    stage(host.incoming, bundle="b", version="1", kernel=kernel, modules=[ModuleSpec(module)])
    code = f"""
import sys
import service.cmd.serve, service.daemon.loop
from service.config import Config
from service.daemon.intake_runner import ChildIntake
from service.layout import Layout
from pathlib import Path
[o] = ChildIntake(Layout(Path({str(host.root)!r})), Config()).run()
assert o.accepted, o
heavy = sorted(m for m in sys.modules
               if m.split('.')[0] in ('cryptography', 'asn1crypto') or m.startswith('service.verify'))
print(heavy)
"""
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, check=True
    )
    assert out.stdout.strip() == "[]", out.stdout + out.stderr


def test_stuck_drops_are_remembered_across_children(
    host: Layout, module: Path, kernel: str
) -> None:
    """Drops that cannot be removed, which an in-process intake remembers across scans, go
    to each child and come back from it; a stuck drop alone is no work for a child."""
    echo = (
        "import sys, json; d = json.loads(sys.stdin.readline());"
        " print(json.dumps({'outcomes': [], 'stuck': {**d['stuck'], 'new': 'why'}}))"
    )
    _work(host)
    runner = ChildIntake(host, Config(), python=(sys.executable, "-c", echo))
    runner.stuck = {"old": "because"}
    assert runner.run() == []
    assert runner.stuck == {"old": "because", "new": "why"}
    shutil.rmtree(host.trash)  # the stand-in child left it
    drop = stage(
        host.incoming, bundle="b", version="1", kernel=kernel, modules=[ModuleSpec(module)]
    )
    assert has_work(host, Config(), {})
    assert not has_work(host, Config(), {str(drop): "cannot be removed"})


def test_a_prepared_child_is_the_one_that_takes_the_drop(
    host: Layout, module: Path, kernel: str
) -> None:
    """With a complete drop waiting, prepare() starts the child at once and run() gives it
    its go (an interpreter that cannot start, set in between, proves no second child);
    without one, prepare() starts nothing."""
    runner = ChildIntake(host, Config())
    runner.prepare()
    assert runner.warm is None
    drop = stage(
        host.incoming, bundle="b", version="1", kernel=kernel, modules=[ModuleSpec(module)]
    )
    runner.prepare()
    assert runner.warm is not None
    runner.python = ("/nonexistent/python",)
    [outcome] = runner.run()
    assert outcome.accepted and outcome.drop == drop and runner.warm is None


def test_a_prepared_child_let_go_takes_nothing(host: Layout, module: Path, kernel: str) -> None:
    """A child started for a drop that is gone by the scan is let go: it exits at the end of
    its input, taking nothing, and the scan starts no other."""
    runner = ChildIntake(host, Config())
    drop = stage(
        host.incoming, bundle="b", version="1", kernel=kernel, modules=[ModuleSpec(module)]
    )
    runner.prepare()
    warm = runner.warm
    assert warm is not None
    shutil.move(drop, host.root / "elsewhere")
    assert runner.run() == [] and runner.warm is None
    assert warm.wait(timeout=60) == 0
    shutil.move(host.root / "elsewhere", drop)
    assert not host.state.exists() and drop.exists()

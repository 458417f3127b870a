"""An intake child killed (SIGKILL, as the out-of-memory killer kills) while building a drop:
that drop is rejected and quarantined with the reason; no retry, no daemon error.

The kills are real: the child process kills itself with SIGKILL at a fault point
(``MODSTAGE_FAULT``), as it would die at the unit's ``MemoryMax=``.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from service import faults
from service.bundles.phase import Phase
from service.bundles.statefile import load
from service.config import Config
from service.daemon.intake_protocol import building, built
from service.daemon.intake_runner import KILLED, ChildIntake, has_work
from service.errors import ServiceError
from service.layout import Layout
from stager.drop import ModuleSpec, stage


def _quarantined(host: Layout) -> list[Path]:
    root = host.var / "quarantine"
    return sorted(p for p in root.iterdir() if p.is_dir()) if root.exists() else []


def test_a_child_killed_building_a_drop_rejects_that_drop(
    host: Layout, module: Path, kernel: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Killed after copying the drop, before verifying it: the run returns the drop's
    rejection (ENOMEM, naming MemoryMax=), the drop is quarantined and its status says
    rejected with the reason; nothing is left to retry, and the next run (a clean child)
    removes the copy the killed one left in the store."""
    drop = stage(
        host.incoming, bundle="b", version="1", kernel=kernel, modules=[ModuleSpec(module)]
    )
    monkeypatch.setenv(faults.FAULT_ENV, "store.copied")
    runner = ChildIntake(host, Config())
    [outcome] = runner.run()
    assert not outcome.accepted and outcome.reasons == (KILLED,)
    assert outcome.drop == drop and outcome.bundle == "b"
    assert not drop.exists()
    assert [p.name for p in _quarantined(host)] == [drop.name]
    status = json.loads((host.status / "b.json").read_text())
    assert status["phase"] == Phase.REJECTED.value and status["errors"] == [KILLED]
    assert load(host.state).bundle("b").pending is None
    assert any(host.store.iterdir()), "the killed child's copy is still in the store"
    assert not has_work(host, Config())
    monkeypatch.delenv(faults.FAULT_ENV)
    assert runner.run() == []
    assert list(host.store.iterdir()) == []


def test_a_child_killed_outside_a_build_is_still_an_error(
    host: Layout, module: Path, kernel: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Killed before any drop is built (the status says verifying, nothing copied): no drop
    to blame, so it stays a service error and the drop is taken in by the next run."""
    drop = stage(
        host.incoming, bundle="b", version="1", kernel=kernel, modules=[ModuleSpec(module)]
    )
    monkeypatch.setenv(faults.FAULT_ENV, "intake.verifying")
    runner = ChildIntake(host, Config())
    with pytest.raises(ServiceError, match="no result"):
        runner.run()
    assert drop.exists() and _quarantined(host) == []
    monkeypatch.delenv(faults.FAULT_ENV)
    [outcome] = runner.run()
    assert outcome.accepted, outcome.reasons


def test_a_good_drop_next_to_the_killed_one_is_taken_in_by_the_next_run(
    host: Layout, module: Path, kernel: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two drops, the child killed building the first: that one is rejected, the other is
    left for the next run (a new child), which takes it in."""
    first = stage(
        host.incoming, bundle="a", version="1", kernel=kernel, modules=[ModuleSpec(module)]
    )
    second = stage(
        host.incoming, bundle="b", version="1", kernel=kernel, modules=[ModuleSpec(module)]
    )
    monkeypatch.setenv(faults.FAULT_ENV, "store.copied")
    runner = ChildIntake(host, Config())
    [killed] = runner.run()
    assert not killed.accepted and killed.drop in (first, second)
    monkeypatch.delenv(faults.FAULT_ENV)
    [taken] = runner.run()
    assert taken.accepted and taken.drop in (first, second) and taken.drop != killed.drop
    assert load(host.state).bundle(str(taken.bundle)).pending == taken.generation


def test_building_lines_round_trip() -> None:
    """The protocol's building line names a drop or none, and refuses anything else."""
    assert built(building("/x/b.1.ab")) == "/x/b.1.ab"
    assert built(building(None)) is None
    for bad in (b"tick\n", b"building 3\n", b"building {\n"):
        with pytest.raises(ValueError):
            built(bad)


def test_the_child_announces_the_drop_it_builds(
    host: Layout, module: Path, kernel: str, tmp_path: Path
) -> None:
    """Run for real, the child's output names the drop before building it and clears it
    after, so a kill in between is blamed on that drop."""
    import subprocess
    import sys

    from service.daemon.intake_runner import CHILD, child_env

    drop = stage(
        host.incoming, bundle="b", version="1", kernel=kernel, modules=[ModuleSpec(module)]
    )
    env = {k: v for k, v in child_env().items() if not k.startswith("MODSTAGE_FAULT")}
    done = subprocess.run(
        [sys.executable, "-m", CHILD, "--root", str(host.root)],
        input=b'{"stuck": {}}\n',
        capture_output=True,
        env=env,
        check=True,
        cwd=os.getcwd(),
    )
    lines = [line + b"\n" for line in done.stdout.splitlines() if line.startswith(b"building")]
    assert [built(line) for line in lines] == [str(drop), None]

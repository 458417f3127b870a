"""SIGKILL at every persisted step of intake and boot, then restart.

Each point of :mod:`service.faults` is hit in a real ``modstage intake`` process (or
the boot runner with the recording kernel), which kills itself there. Afterwards:
state.json parses, every published generation is complete and matches its manifest,
no staged generation is lost (its drop is still complete in incoming/, or it is
pending or active), and the next run completes.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from service import faults
from service.bundles.phase import Phase
from service.bundles.statefile import load
from service.layout import Layout
from stager.schema.manifest import Manifest
from stager.schema.paths import MANIFEST_NAME
from tests.hardening.conftest import make_intake, stage_drop
from tests.hardening.invariants import complete_drops, not_lost, published_problems, state_of
from tests.service.fakes import FakeKernel

REPO = Path(__file__).resolve().parents[2]


def _run(
    argv: list[str], fault: str | None = None, trace: Path | None = None
) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("MODSTAGE_FAULT")}
    env["PYTHONPATH"] = str(REPO)
    if fault:
        env[faults.FAULT_ENV] = fault
    if trace:
        env[faults.TRACE_ENV] = str(trace)
    return subprocess.run(
        [sys.executable, *argv], cwd=REPO, env=env, capture_output=True, text=True, timeout=60
    )


def intake(layout: Layout, **kw: object) -> subprocess.CompletedProcess[str]:
    """``modstage intake --root`` in its own process."""
    return _run(["-m", "service.cli", "intake", "--root", str(layout.root)], **kw)  # type: ignore[arg-type]


def boot(layout: Layout, *fail: str, **kw: object) -> subprocess.CompletedProcess[str]:
    """One boot with the recording fake kernel in its own process."""
    argv = ["-m", "tests.hardening.boot_runner", str(layout.root)]
    for name in fail:
        argv += ["--fail", name]
    return _run(argv, **kw)  # type: ignore[arg-type]


def _digest(drop: Path) -> str:
    return Manifest.from_toml((drop / MANIFEST_NAME).read_bytes()).digest


def _assert_sound(layout: Layout, staged: dict[str, str]) -> None:
    state_of(layout)  # parses
    assert published_problems(layout) == []
    for bundle, generation in staged.items():
        assert not_lost(layout, bundle, generation), f"{bundle} {generation[:12]} lost"


def _trace(tmp_path: Path, run: object) -> list[str]:
    trace = tmp_path / "trace"
    run(trace)  # type: ignore[operator]
    return list(dict.fromkeys(trace.read_text().split()))


def _last_point(trace: Path) -> str | None:
    """The last fault point a run reached (from its ``MODSTAGE_FAULT_TRACE`` file)."""
    points = trace.read_text().split() if trace.exists() else []
    return points[-1] if points else None


def _assert_killed_at(done: subprocess.CompletedProcess[str], trace: Path, point: str) -> None:
    """The run died of SIGKILL, and at ``point`` (``name[:n]``): the last point it reached."""
    assert done.returncode == -9, (point, done.returncode, done.stderr)
    assert _last_point(trace) == point.partition(":")[0], trace.read_text()


@pytest.fixture
def staged(host: Layout, kernel: str, signed: dict[str, Path]) -> dict[str, str]:
    """Bundle ``other`` taken in earlier; a drop of bundle ``test`` waiting in incoming/."""
    stage_drop(host, kernel, [signed["ms_params"]], bundle="other")
    [o] = make_intake(host).run()
    drop = stage_drop(host, kernel, [signed["ms_exporter"], signed["ms_consumer"]])
    return {"other": str(o.generation), "test": _digest(drop)}


def test_intake_passes_every_point_in_order(
    host: Layout, staged: dict[str, str], tmp_path: Path
) -> None:
    """A clean intake reaches exactly the intake points, in the documented order."""
    assert _trace(tmp_path, lambda t: intake(host, trace=t)) == list(faults.INTAKE_POINTS)


@pytest.mark.parametrize("point", faults.INTAKE_POINTS)
def test_intake_killed_at_each_point(
    host: Layout, staged: dict[str, str], point: str, tmp_path: Path
) -> None:
    """Killed at ``point``: sound on disk; the next intake completes with the drop pending."""
    trace = tmp_path / "trace"
    _assert_killed_at(intake(host, fault=point, trace=trace), trace, point)
    _assert_sound(host, staged)
    again = intake(host)
    assert again.returncode == 0, again.stdout + again.stderr
    _assert_sound(host, staged)
    b = load(host.state).bundle("test")
    assert (b.phase, b.pending) == (Phase.PENDING, staged["test"])
    assert complete_drops(host) == []
    assert [p.name for p in host.store.iterdir() if p.name.startswith(".tmp-")] == []


def test_intake_killed_at_every_point_in_turn(
    host: Layout, staged: dict[str, str], tmp_path: Path
) -> None:
    """One host killed at each point in turn (each run resumes the last), then a clean run.

    Every run is killed, and at its point: each resumed run still passes every later
    point (none is skipped because an earlier kill left work half done)."""
    for point in faults.INTAKE_POINTS:
        trace = tmp_path / f"trace-{point}"
        _assert_killed_at(intake(host, fault=point, trace=trace), trace, point)
        _assert_sound(host, staged)
    assert intake(host).returncode == 0
    assert load(host.state).bundle("test").pending == staged["test"]


def _spoil(host: Layout, kernel: str, modules: dict[str, Path]) -> None:
    """Replace the waiting good drop by one with an unsigned module."""
    for d in complete_drops(host):
        shutil.rmtree(d)
    stage_drop(host, kernel, [modules["ms_exporter"]], version="9")


def test_rejection_passes_its_points(
    host: Layout, staged: dict[str, str], kernel: str, modules: dict[str, Path], tmp_path: Path
) -> None:
    """Rejecting a drop that fails verification reaches the rejection points."""
    _spoil(host, kernel, modules)
    seen = _trace(tmp_path, lambda t: intake(host, trace=t))
    assert seen == ["intake.verifying", "store.copied", "intake.rejected", "quarantine.moved"]


REJECTED_AGAIN = {"intake.rejected": 1, "quarantine.moved": 0}  # the next run's exit code


@pytest.mark.parametrize("point", faults.REJECT_POINTS)
def test_rejection_killed(
    host: Layout,
    staged: dict[str, str],
    kernel: str,
    modules: dict[str, Path],
    point: str,
    tmp_path: Path,
) -> None:
    """Killed while rejecting a bad drop: state untouched, nothing published; next run finishes."""
    _spoil(host, kernel, modules)
    before = host.state.read_bytes()
    store = sorted(host.store.iterdir())
    trace = tmp_path / "trace"
    _assert_killed_at(intake(host, fault=point, trace=trace), trace, point)
    assert host.state.read_bytes() == before and sorted(host.store.iterdir()) == store
    again = intake(host)
    # killed before the drop moved: it is rejected again (1); after: nothing is left (0)
    assert again.returncode == REJECTED_AGAIN[point], again.stdout + again.stderr
    assert host.state.read_bytes() == before and sorted(host.store.iterdir()) == store
    assert complete_drops(host) == []


@pytest.fixture
def pending(host: Layout, staged: dict[str, str]) -> dict[str, str]:
    """Both bundles pending (taken in, never booted)."""
    [o] = make_intake(host).run()
    assert o.accepted, o.reasons
    return staged


def test_boot_passes_every_point_in_order(
    host: Layout, pending: dict[str, str], tmp_path: Path
) -> None:
    """A clean boot reaches exactly the boot points, in the documented order."""
    assert _trace(tmp_path, lambda t: boot(host, trace=t)) == list(faults.BOOT_POINTS)


def test_boot_records_its_boot_id_with_the_first_attempt(
    host: Layout, pending: dict[str, str], tmp_path: Path
) -> None:
    """The boot id is in the state saved with the first attempt (no save of its own)."""
    trace = tmp_path / "trace"
    point = "state.loading.saved"
    _assert_killed_at(boot(host, fault=point, trace=trace), trace, point)
    assert load(host.state).boot_id == host.boot_id.read_text().strip()


def test_idle_boot_saves_its_boot_id_alone(host: Layout, tmp_path: Path) -> None:
    """A boot with no bundle saves the boot id by itself, at the idle boot points; killed at
    either, the state still parses and the next boot records the id."""
    killed = tmp_path / "killed"
    point = faults.IDLE_BOOT_POINTS[0]
    _assert_killed_at(boot(host, fault=point, trace=killed), killed, point)
    assert _trace(tmp_path, lambda t: boot(host, trace=t)) == list(faults.IDLE_BOOT_POINTS)
    assert load(host.state).boot_id == host.boot_id.read_text().strip()


@pytest.mark.parametrize(
    "point",
    [
        *faults.BOOT_POINTS,
        "state.loading.saved:2",
        "boot.finit.after:2",
        "boot.finit.after:3",
        "state.active.saved:2",
    ],
)
def test_boot_killed_at_each_point(
    host: Layout, pending: dict[str, str], point: str, tmp_path: Path
) -> None:
    """Killed at ``point`` (a power cut mid-boot): sound; the next boot makes both active."""
    trace = tmp_path / "trace"
    _assert_killed_at(boot(host, fault=point, trace=trace), trace, point)
    _assert_sound(host, pending)
    again = boot(host)
    assert again.returncode == 0, again.stdout + again.stderr
    _assert_sound(host, pending)
    for bundle, generation in pending.items():
        b = load(host.state).bundle(bundle)
        assert (b.phase, b.active, b.pending) == (Phase.ACTIVE, generation, None)


@pytest.fixture
def failing(
    host: Layout, kernel: str, signed: dict[str, Path], pending: dict[str, str]
) -> dict[str, str]:
    """``test`` active after a good boot, then a pending generation whose module fails to load."""
    from service.boot.loader import Boot
    from service.config import Config
    from service.verify.signature.trust import TrustStore

    Boot(host, Config(), TrustStore.from_directory(host.trusted), FakeKernel()).run()
    stage_drop(host, kernel, [signed["ms_enodev"]], version="2")
    [o] = make_intake(host).run()
    assert o.accepted, o.reasons
    return {**pending, "bad": str(o.generation)}


def test_failing_boot_passes_the_failure_points(
    host: Layout, failing: dict[str, str], tmp_path: Path
) -> None:
    """A boot whose pending generation fails reaches the failed-state points."""
    seen = _trace(tmp_path, lambda t: boot(host, "ms_enodev", trace=t))
    assert set(faults.BOOT_FAIL_POINTS) <= set(seen)


@pytest.mark.parametrize("point", faults.BOOT_FAIL_POINTS)
def test_failing_boot_killed_at_each_point(
    host: Layout, failing: dict[str, str], point: str, tmp_path: Path
) -> None:
    """Killed while recording a failure: the last good generation is kept and reloaded next boot."""
    trace = tmp_path / "trace"
    _assert_killed_at(boot(host, "ms_enodev", fault=point, trace=trace), trace, point)
    good = {k: v for k, v in failing.items() if k != "bad"}
    _assert_sound(host, good)
    again = boot(host, "ms_enodev")
    assert again.returncode == 0, again.stdout + again.stderr
    b = load(host.state).bundle("test")
    assert (b.phase, b.active, b.pending) == (Phase.ACTIVE, failing["test"], None)
    assert str(b.generations[failing["bad"]].failed).startswith("modules/ms_enodev.ko: ENODEV")

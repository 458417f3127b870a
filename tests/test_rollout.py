"""bench/rollout's simulation agrees with the arithmetic it stands for, on small cases."""

from __future__ import annotations

import io
import math
import random
import sys
from contextlib import redirect_stdout
from datetime import time
from importlib.machinery import SourceFileLoader
from pathlib import Path
from types import ModuleType

import pytest

from service.rebooting.window import Window

BENCH = Path(__file__).resolve().parents[1] / "bench/rollout"


@pytest.fixture(scope="module")
def rollout() -> ModuleType:
    """The bench script, loaded as a module."""
    loader = SourceFileLoader("bench_rollout", str(BENCH))
    module = ModuleType(loader.name)
    module.__file__ = str(BENCH)
    sys.modules[loader.name] = module  # dataclasses look their module up
    loader.exec_module(module)
    return module


def kured(rollout: ModuleType, **kw: object) -> object:
    """A kured model with fixed costs (no spread): 600 s per node, 10 s ticks, no window."""
    base: dict[str, object] = {
        "concurrency": 1,
        "period": 10.0,
        "window": None,
        "stage": 100.0,
        "drain": rollout.Drain(300, 0.0, 600),
        "reboot": 200.0,
        "modstage_boot": 10.0,
        "ready": 90.0,
    }
    return rollout.Kured(**{**base, **kw})


@pytest.mark.parametrize(("nodes", "concurrency"), [(1, 1), (10, 1), (10, 3), (100, 10)])
def test_kured_without_a_window_is_rounds_of_the_lock(
    rollout: ModuleType, nodes: int, concurrency: int
) -> None:
    """Without a window: stage, then ceil(N/c) rounds of one node's cost, each round starting
    within one kured period of the slot freeing."""
    k = kured(rollout, concurrency=concurrency)
    got = rollout.kured_rollout(nodes, k, random.Random(1))
    rounds = math.ceil(nodes / concurrency)
    assert 100 + rounds * 600 <= got <= 100 + rounds * (600 + 10)


def test_the_window_pauses_the_rollout_until_it_opens_again(rollout: ModuleType) -> None:
    """Mondays 02:00-05:00 and 3,700 s per node: three nodes on Monday, the fourth a week later."""
    window = Window(("mon",), time(2, 0), time(5, 0))
    k = kured(rollout, window=window, drain=rollout.Drain(3400, 0.0, 9999))
    got = rollout.kured_rollout(4, k, random.Random(1))
    next_monday = 7 * 86400 + 2 * 3600
    assert next_monday + 3700 <= got <= next_monday + 3700 + 10


def test_a_longer_period_costs_time_at_every_hand_over(rollout: ModuleType) -> None:
    """kured's default 1 h period, one waiting node: each hand-over waits for that node's tick."""
    fast = rollout.kured_rollout(2, kured(rollout, period=10.0), random.Random(3))
    slow = rollout.kured_rollout(2, kured(rollout, period=3600.0), random.Random(3))
    assert slow > fast


@pytest.mark.parametrize(
    ("nodes", "parallel", "slots"), [(10, 1, 1), (10, 0, 2), (100, 0, 25), (100, 5, 5)]
)
def test_operator_runs_min_of_max_parallel_and_max_unavailable(
    rollout: ModuleType, nodes: int, parallel: int, slots: int
) -> None:
    """maxParallelUpgrades (0: unlimited) bounded by maxUnavailable 25%; a node takes a state
    per reconcile: 6 reconciles + eviction + driver restart + validation, the first nodes
    start on the second reconcile and a freed slot is taken on the next one."""
    o = rollout.Operator(parallel, 0.25, 30.0, rollout.Drain(300, 0.0, 600), 180.0, 60.0)
    assert o.slots(nodes) == slots
    got, driverless = rollout.operator_rollout(nodes, o, random.Random(1))
    rounds = math.ceil(nodes / slots)
    assert got == pytest.approx(2 * 30 + rounds * (6 * 30 + 300 + 180 + 60) + (rounds - 1) * 30)
    assert driverless == [180.0] * nodes


def test_under_the_operator_a_node_is_driverless_from_its_pod_to_its_boot(
    rollout: ModuleType,
) -> None:
    """modstage's container under the controller: the driver is gone from the pod's start
    (its init container unloads) until ``modstage boot``: staging, kured's next tick, drain,
    reboot, boot; the node is done once its pod is ready and the controller validated."""
    o = rollout.Operator(1, 0.25, 30.0, rollout.Drain(300, 0.0, 600), 180.0, 60.0)
    k = kured(rollout, stage=20.0)
    got, driverless = rollout.operator_rollout(
        3, o, random.Random(2), rollout.staged_reboot(k, 5.0)
    )
    floor = 20 + 300 + 200 + 10
    assert all(floor <= d <= floor + 10 for d in driverless), driverless
    live, _ = rollout.operator_rollout(3, o, random.Random(2))
    slower = floor + 90 + 5 - 180  # per node: the reboot path against the live swap
    assert got > live and got - live <= 3 * (slower + 10 + 2 * 30)


def test_a_window_holds_a_node_without_its_driver_until_it_opens(rollout: ModuleType) -> None:
    """The controller deletes the pod outside the window: the node waits, without a driver,
    until the window opens (Mondays 02:00)."""
    o = rollout.Operator(1, 0.25, 30.0, rollout.Drain(300, 0.0, 600), 180.0, 60.0)
    k = kured(rollout, window=Window(("mon",), time(2, 0), time(5, 0)))
    _, [driverless] = rollout.operator_rollout(1, o, random.Random(1), rollout.staged_reboot(k, 5))
    assert 2 * 3600 - 600 <= driverless <= 2 * 3600 + 300 + 200 + 10 + 10


def test_the_command_prints_one_row_per_size(rollout: ModuleType) -> None:
    """``bench/rollout`` prints the parameters and a row for each cluster size."""
    out = io.StringIO()
    with redirect_stdout(out):
        assert rollout.main(["--runs", "1", "--sizes", "10", "100"]) == 0  # the measured file
    rows = [ln.split()[0] for ln in out.getvalue().splitlines() if ln.strip()[:1].isdigit()]
    assert rows == ["10", "100"]
    assert "--concurrency=1" in out.getvalue() and "maxParallelUpgrades=1" in out.getvalue()

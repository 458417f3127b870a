"""The decompression budgets (``service.verify.compressed.budget``) on plain values: the
process's gate, one drop's byte budget and its scope, and how many workers run."""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path

import pytest

from service.config import Limits
from service.errors import ModuleRejected
from service.verify.compressed import budget
from service.verify.compressed.budget import DropBudget, Gate, drop_budget, per_drop, run_all


def test_the_gate_admits_what_fits_and_a_cost_alone_even_past_the_budget() -> None:
    """Costs are admitted while their sum fits the budget (exactly fitting counts); a cost
    larger than the budget is admitted when nothing is held; what leaves is given back."""
    gate = Gate(10)
    assert gate.peak == 0  # nothing admitted yet
    with gate.admitted(4), gate.admitted(6):
        assert gate.held == 10
    assert gate.held == 0 and gate.peak == 10
    with gate.admitted(25):
        assert gate.held == 25
    assert gate.held == 0


def test_the_gate_makes_a_cost_that_does_not_fit_wait_until_one_leaves() -> None:
    """With 6 of 10 held, a cost of 5 waits; it is admitted once the 6 is given back, and
    never were both held at once."""
    gate = Gate(10)
    entered = threading.Event()
    release = threading.Event()

    def second() -> None:
        with gate.admitted(5):
            entered.set()

    with gate.admitted(6):
        thread = threading.Thread(target=second)
        thread.start()
        assert not entered.wait(0.3)
        release.set()
    assert entered.wait(10)
    thread.join()
    assert gate.peak == 6 and gate.held == 0


def test_a_drop_may_decompress_exactly_its_limit_and_not_a_byte_more() -> None:
    """``add`` up to the limit is fine and ``left`` counts down to 0; one byte past it is
    EFBIG naming the limit, and ``left`` never goes negative."""
    drop = DropBudget(100)
    drop.add(60)
    assert drop.left() == 40
    drop.add(40)
    assert drop.left() == 0
    with pytest.raises(ModuleRejected) as refused:
        drop.add(1)
    assert refused.value.refusal.errno == "EFBIG" and "over 100 bytes" in refused.value.reason
    assert drop.left() == 0


def test_per_drop_sets_the_limit_and_spill_of_the_drops_within_and_restores_them(
    tmp_path: Path,
) -> None:
    """Inside ``per_drop`` a fresh budget has its limit and spill directory; after it, the
    default limit (``Limits``) and no spill directory again."""
    with per_drop(7, tmp_path):
        inside = drop_budget()
        assert (inside.limit, inside.spill) == (7, str(tmp_path))
        with per_drop(3):
            assert (drop_budget().limit, drop_budget().spill) == (3, None)
        assert drop_budget().limit == 7
    after = drop_budget()
    assert (after.limit, after.spill) == (Limits().max_decompressed_bytes, None)


def test_workers_are_one_per_core_up_to_the_maximum_or_as_forced(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Without the environment variable: at most one per job, per core and
    ``MAX_WORKERS``; with it, exactly its number (at most one per job, at least one)."""
    monkeypatch.delenv(budget.WORKERS_ENV, raising=False)
    cores = os.cpu_count() or 2
    assert budget.workers(100) == min(cores, budget.MAX_WORKERS)
    assert budget.workers(1) == 1
    monkeypatch.setattr(os, "cpu_count", lambda: 64)
    assert budget.workers(100) == budget.MAX_WORKERS
    monkeypatch.setattr(os, "cpu_count", lambda: 1)
    assert budget.workers(100) == 1
    monkeypatch.setenv(budget.WORKERS_ENV, "7")
    assert budget.workers(100) == 7
    assert budget.workers(3) == 3
    monkeypatch.setenv(budget.WORKERS_ENV, "0")
    assert budget.workers(5) == 1


def test_run_all_returns_results_in_order_and_runs_jobs_at_once(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Results come in the jobs' order; with two workers forced, two jobs overlap (each
    waits for the other to start)."""
    monkeypatch.setenv(budget.WORKERS_ENV, "2")
    both = threading.Barrier(2, timeout=10)

    def job(n: int) -> int:
        both.wait()
        time.sleep(0.01 * (2 - n))
        return n

    assert run_all([lambda: job(0), lambda: job(1)]) == [0, 1]
    assert run_all([lambda: 5]) == [5]


_FREED_BUFFER_PROBE = """
import ctypes, os, sys
from service.verify.compressed import budget

class Mallinfo2(ctypes.Structure):
    _fields_ = [(n, ctypes.c_size_t) for n in (
        "arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks",
        "uordblks", "fordblks", "keepcost")]

libc = ctypes.CDLL(None)
libc.malloc.restype = ctypes.c_void_p
libc.free.argtypes = [ctypes.c_void_p]
libc.mallinfo2.restype = Mallinfo2
if sys.argv[1] == "run_all":
    os.environ[budget.WORKERS_ENV] = "2"
    budget.run_all([lambda: 0, lambda: 1])
libc.free(libc.malloc(4 << 20))  # glibc's dynamic threshold would rise to 4 MiB
before = libc.mallinfo2().hblks
buffer = libc.malloc(1 << 20)
print(libc.mallinfo2().hblks - before)
libc.free(buffer)
"""


@pytest.mark.parametrize(("how", "mapped"), [("run_all", "1"), ("alone", "0")])
def test_parallel_verification_makes_glibc_give_freed_buffers_back(how: str, mapped: str) -> None:
    """After ``run_all`` started a pool, a 1 MiB buffer is its own mapping (given back to the
    system when freed) even once a 4 MiB one was freed, which without it raises glibc's
    threshold to 4 MiB: the decompressors' buffers are not kept in each worker's arena. The
    control (no ``run_all``) shows glibc's default rising threshold, so the probe can fail.
    In a fresh interpreter: the threshold is per process."""
    import subprocess
    import sys

    probe = subprocess.run(
        [sys.executable, "-c", _FREED_BUFFER_PROBE, how],
        capture_output=True, text=True, check=True, cwd=Path(__file__).parents[2],
    )  # fmt: skip
    assert probe.stdout.strip() == mapped, probe.stderr

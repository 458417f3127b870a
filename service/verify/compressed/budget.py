"""How much memory verification may hold at once, and how far one drop may expand.

A plain file is streamed through 1 MiB buffers. A compressed module costs its
decompressor's window (see :mod:`service.verify.compressed.stated`) and the buffers its
output passes through on the way to a temporary file (its image is never held in memory).
The process's one :class:`Gate` admits decompressions while their costs fit
:data:`MEMORY_BUDGET` (one always fits, alone), so the intake's peak is set by this budget,
never by the number of cores or of modules. :class:`DropBudget` counts the bytes one drop's
modules decompress to against ``limits.max_decompressed_bytes``: past it, every further
module is refused.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import TypeVar

from service.config import Limits
from service.errors import ModuleRejected

T = TypeVar("T")

#: Bytes of decompressor windows and buffers in flight at once, in the whole process.
MEMORY_BUDGET = 12 << 20
#: Verification workers at most: besides what the gate admits, each may hold one module's
#: ELF tables (``.modinfo``, section names: 16 MiB each at most, see modinfo.MAX_TABLE) and
#: a 1 MiB buffer. Four keep that under 140 MiB on any host; hashing a bundle needs no more.
MAX_WORKERS = 4
#: Workers forced (default: one per core up to MAX_WORKERS): the bench sets it to show that
#: the gate, not the number of workers, bounds decompression.
WORKERS_ENV = "MODSTAGE_VERIFY_WORKERS"
M_MMAP_THRESHOLD = -3  # glibc's mallopt parameter


class Gate:
    """Admits costs (bytes) while their sum fits ``budget``; a cost alone is always admitted."""

    def __init__(self, budget: int) -> None:
        self.budget = budget
        self.held = 0
        self.peak = 0  # the most held at once (the tests read it)
        self._cond = threading.Condition()

    @contextmanager
    def admitted(self, cost: int) -> Iterator[None]:
        """Wait until ``cost`` fits beside what is held, hold it for the ``with`` block."""
        with self._cond:
            self._cond.wait_for(lambda: self.held == 0 or self.held + cost <= self.budget)
            self.held += cost
            self.peak = max(self.peak, self.held)
        try:
            yield
        finally:
            with self._cond:
                self.held -= cost
                self._cond.notify_all()


GATE = Gate(MEMORY_BUDGET)


class DropBudget:
    """One drop's decompressed bytes so far against its ``limit`` (thread-safe), and where
    its images are spilled (``spill``: a private directory; None: the system's)."""

    def __init__(self, limit: int, spill: str | None = None) -> None:
        self.limit = limit
        self.spill = spill
        self.total = 0
        self._lock = threading.Lock()

    def left(self) -> int:
        """Bytes the drop may still decompress."""
        with self._lock:
            return max(0, self.limit - self.total)

    def add(self, n: int) -> None:
        """Count ``n`` more bytes; EFBIG once the drop's total passes its limit."""
        with self._lock:
            self.total += n
            over = self.total > self.limit
        if over:
            raise ModuleRejected("EFBIG", self.why())

    def why(self) -> str:
        """The refusal of a module that takes the drop past its limit."""
        return (
            f"the drop's modules decompress to over {self.limit} bytes together"
            " (limits.max_decompressed_bytes)"
        )


_scope: list[tuple[int, str | None]] = [(Limits().max_decompressed_bytes, None)]


@contextmanager
def per_drop(limit: int, spill: Path | None = None) -> Iterator[None]:
    """Within the block, a drop verified may decompress to ``limit`` bytes (intake's
    ``limits.max_decompressed_bytes``; the default elsewhere), spilled into ``spill``
    (intake's private copy of the drop; elsewhere the system's temporary directory)."""
    _scope.append((limit, None if spill is None else str(spill)))
    try:
        yield
    finally:
        _scope.pop()


def drop_budget() -> DropBudget:
    """A fresh budget for one drop, as :func:`per_drop` set it."""
    return DropBudget(*_scope[-1])


def workers(jobs: int) -> int:
    """How many jobs run at once: one per core up to :data:`MAX_WORKERS`, or exactly
    :data:`WORKERS_ENV`'s number (the bench's and the tests' way to force more)."""
    try:
        wanted = int(os.environ.get(WORKERS_ENV, ""))
    except ValueError:
        wanted = min(os.cpu_count() or 2, MAX_WORKERS)
    return max(1, min(jobs, wanted))


def run_all(jobs: Sequence[Callable[[], T]]) -> list[T]:
    """Run verification jobs in parallel (hashlib and the decompressors release the GIL),
    results in order; what a job decompresses waits for :data:`GATE` inside the job."""
    if len(jobs) < 2 or workers(len(jobs)) == 1:
        return [job() for job in jobs]
    from concurrent.futures import ThreadPoolExecutor  # several files only, not at boot

    _return_freed_buffers()
    with ThreadPoolExecutor(max_workers=workers(len(jobs))) as pool:
        return list(pool.map(lambda job: job(), jobs))


def _return_freed_buffers() -> None:
    """Make glibc give buffers of 128 KiB and more back to the system when they are freed.

    By default its threshold for that rises to the largest buffer freed (up to 32 MiB),
    and each thread's arena then keeps the decompressors' buffers: a peak that grows with
    the number of workers, which the gate cannot see. Not glibc: nothing to do.
    """
    import ctypes

    with suppress(OSError, AttributeError):
        ctypes.CDLL(None).mallopt(M_MMAP_THRESHOLD, 128 << 10)

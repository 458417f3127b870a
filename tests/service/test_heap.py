"""The daemon gives freed heap back to the kernel after an intake."""

from __future__ import annotations

from pathlib import Path

from service.daemon import heap


def rss_kib() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise AssertionError("no VmRSS")


def test_trim_returns_freed_heap_pages() -> None:
    """After many freed small blocks (kept by glibc), trim() shrinks the RSS and says so."""
    blocks = [bytearray(64 * 1024) for _ in range(800)]  # 50 MiB below the mmap threshold
    keep = blocks[-1]
    del blocks
    before = rss_kib()
    assert heap.trim() is True
    assert rss_kib() < before - 10 * 1024
    assert len(keep) == 64 * 1024

"""The bounds docs/verify.md promises an operator are the code's: the stated-size refusal, the
decompressors' memory budget and the number of verification workers. The docs are where these
figures are chosen (a host is sized by them: deploy/README.md); a change to one of the
constants must change the docs with it, or this fails."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from service.verify.compressed import budget, decompress

VERIFY_DOC = Path(__file__).resolve().parents[2] / "docs" / "verify.md"
WORDS = {"one": 1, "two": 2, "three": 3, "four": 4, "five": 5, "six": 6, "eight": 8}
UNITS = {"KiB": 1 << 10, "MiB": 1 << 20, "GiB": 1 << 30}


def _memory_section() -> str:
    """docs/verify.md's paragraph on memory, lines joined."""
    text = VERIFY_DOC.read_text()
    start = text.index("**Memory.**")
    return " ".join(text[start : text.index("\n\n", start)].split())


def _figure(pattern: str) -> int:
    """The size or count ``pattern``'s one group names in the memory paragraph, in bytes."""
    found = re.search(pattern, _memory_section())
    assert found, f"docs/verify.md's memory paragraph no longer says {pattern!r}"
    figure = found.group(1)
    if figure in WORDS:
        return WORDS[figure]
    number, unit = figure.split()
    return int(number) * UNITS[unit]


def test_the_stated_size_refused_is_the_documented_one() -> None:
    """ "over 512 MiB ... the module is refused (EFBIG)": the decompression cap is that."""
    assert _figure(r"states .*? is read first: over (\d+ [KMG]iB)") == decompress.MAX_DECOMPRESSED


def test_the_memory_budget_is_the_documented_one() -> None:
    """ "Decompressors wait for a 12 MiB memory budget": the process's gate has exactly it."""
    documented = _figure(r"wait for a (\d+ [KMG]iB) memory budget")
    assert documented == budget.MEMORY_BUDGET
    assert budget.GATE.budget == documented


def test_the_workers_are_the_documented_number(monkeypatch: pytest.MonkeyPatch) -> None:
    """ "at most four verification workers run whatever the core count", and a host whose
    core count is unknown runs the documented number; a host of one core runs one."""
    monkeypatch.delenv(budget.WORKERS_ENV, raising=False)
    most = _figure(r"at most (\w+) verification workers")
    unknown = _figure(r"core count is unknown runs (\w+)")
    assert unknown <= most
    monkeypatch.setattr(budget.os, "cpu_count", lambda: 256)
    assert budget.MAX_WORKERS == most == budget.workers(1000)
    monkeypatch.setattr(budget.os, "cpu_count", lambda: None)
    assert budget.workers(1000) == unknown
    monkeypatch.setattr(budget.os, "cpu_count", lambda: 1)
    assert budget.workers(1000) == 1

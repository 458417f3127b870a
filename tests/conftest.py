"""Settings for the whole test suite.

Hypothesis: no per-example deadline and no "too slow" health check. CI machines are
shared and their load varies, so wall time per example says nothing about correctness.
Performance is measured by the benchmarks under bench/, not by tests.
"""

import os
import shutil
import tempfile
from pathlib import Path

import pytest
from hypothesis import HealthCheck, settings

from tests.tiers import Needs, item_needs

settings.register_profile("modstage", deadline=None, suppress_health_check=[HealthCheck.too_slow])
settings.load_profile("modstage")


def pytest_configure(config: pytest.Config) -> None:
    """The session's own staged-notes directory, set before any fixture runs: a session
    fixture that stages (tests/nvidia) would otherwise note its drop in the shared
    ``<tmp>/modstage-<uid>/`` and a later ``wait --bundle`` would wait for that drop."""
    os.environ["MODSTAGE_STAGED_DIR"] = tempfile.mkdtemp(prefix="modstage-test-notes-")


def pytest_unconfigure(config: pytest.Config) -> None:
    """The session's staged-notes directory goes with the session (a mutation run starts
    hundreds of sessions)."""
    notes = os.environ.pop("MODSTAGE_STAGED_DIR", None)
    if notes:
        shutil.rmtree(notes, ignore_errors=True)


@pytest.fixture(autouse=True)
def _staged_notes(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """``modstage stage`` notes its last drop for ``wait`` (stager/staged.py): per test, never
    in the shared tmp directory, so one test's drop is not another's."""
    monkeypatch.setenv("MODSTAGE_STAGED_DIR", str(tmp_path / "staged-notes"))


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Mark every test with what it needs of the machine (tests/tiers.py): ``kbuild`` for
    Debian's kernel packages, ``root`` for root; before ``-m`` selects."""
    needs = Needs()
    for item in items:
        if not isinstance(item, pytest.Function):
            continue
        defs = item._fixtureinfo.name2fixturedefs
        fixtures = [d for name in item.fixturenames for d in defs.get(name, ())]
        for marker in sorted(item_needs(needs, item.function, fixtures)):
            item.add_marker(marker)

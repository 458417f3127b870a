"""What ``modstage wait`` says while it waits, and which noted drop ``wait --bundle`` follows:
only one staged into the incoming directory beside the status directory, and not one the
host has moved past."""

from __future__ import annotations

import io
import json
import shutil
import time
from dataclasses import replace
from pathlib import Path

import pytest

from service.cli import main
from service.layout import Layout
from service.publish.bundle_status import write_status
from stager.schema.statusfile import StatusFile
from stager.wait import EXIT_ACTIVE, EXIT_TIMEOUT
from tests.stager.argv import module_bytes, stage_argv
from tests.stager.test_wait import GEN, OLD, active, pending
from tests.stager.test_wait_errors import wait


def stage(layout: Layout, tmp_path: Path) -> Path:
    """``modstage stage`` one module into ``layout``'s incoming directory; the drop."""
    layout.incoming.mkdir(parents=True, exist_ok=True)
    module = tmp_path / "nvidia.ko"
    module.write_bytes(module_bytes())
    out = io.StringIO()
    assert main(stage_argv(layout.incoming, "--module", str(module)), out) == 0
    return Path(out.getvalue().strip())


def test_no_line_prints_a_python_none(tmp_path: Path) -> None:
    """Nothing pending: the line names the active generation and says ``none``, never
    Python's ``None``."""
    layout = Layout(tmp_path)
    write_status(layout, "nvidia", replace(pending(), pending=None))
    code, out = wait(layout.status, "--generation", "deadbeef", "--timeout", "0")
    assert code == EXIT_TIMEOUT and "None" not in out
    assert f"pending none, active {OLD[:12]}" in out


def test_a_held_bundle_says_it_is_held_by_the_admin(tmp_path: Path) -> None:
    """The status file of a held bundle says so (``held``, absent when false), and ``wait``
    for the drop waiting in incoming says the admin holds the bundle and names the drop."""
    layout = Layout(tmp_path)
    drop = stage(layout, tmp_path)
    time.sleep(0.002)  # the status is written after the drop (``updated`` has ms)
    held = replace(active(), held=True)
    write_status(layout, "nvidia", held, errors=["held by an admin"], drop=drop.name)
    assert json.loads((layout.status / "nvidia.json").read_text())["held"] is True
    code, out = wait(layout.status, "--drop", str(drop), "--timeout", "0")
    assert code == EXIT_TIMEOUT
    assert f"the bundle is held by an admin: drop {drop.name}" in out, out
    assert "not known" not in out
    write_status(layout, "nvidia", active())
    assert "held" not in json.loads((layout.status / "nvidia.json").read_text())
    doc = StatusFile.read(layout.status / "nvidia.json")
    assert doc is not None and not doc.held


def test_a_note_of_a_drop_into_another_incoming_directory_is_ignored(tmp_path: Path) -> None:
    """A drop staged into another host tree's incoming directory is not what ``wait
    --bundle`` on this status directory waits for: it answers for this tree's generation."""
    elsewhere, here = Layout(tmp_path / "a"), Layout(tmp_path / "b")
    stage(elsewhere, tmp_path)
    write_status(here, "nvidia", active(), generation=GEN)
    code, out = wait(here.status, "--timeout", "0")
    assert code == EXIT_ACTIVE, out
    assert "last drop staged" not in out


def test_a_noted_drop_the_host_moved_past_is_not_waited_for(tmp_path: Path) -> None:
    """The noted drop was taken in, and a status written since names another generation
    and not the drop (a newer drop superseded it): ``wait --bundle`` says so and follows
    the generation the status names instead of waiting forever."""
    layout = Layout(tmp_path)
    drop = stage(layout, tmp_path)
    shutil.rmtree(drop)  # taken in
    time.sleep(0.002)
    write_status(layout, "nvidia", active(), generation=GEN)
    code, out = wait(layout.status, "--timeout", "0")
    assert code == EXIT_ACTIVE, out
    assert f"the last drop staged, {drop.name}" in out and "was superseded" in out


@pytest.mark.parametrize("in_incoming", [True, False])
def test_a_noted_drop_still_ahead_is_waited_for_and_named(
    tmp_path: Path, in_incoming: bool
) -> None:
    """A status written before the drop (still in incoming, or taken in without a status
    yet) is not a reason to drop the note: ``wait --bundle`` names the drop, its generation
    and its directory, and keeps waiting."""
    layout = Layout(tmp_path)
    write_status(layout, "nvidia", active(), generation=GEN)
    time.sleep(0.002)
    drop = stage(layout, tmp_path)
    if not in_incoming:
        shutil.rmtree(drop)
    code, out = wait(layout.status, "--timeout", "0")
    assert code == EXIT_TIMEOUT, out
    where = "in" if in_incoming else "taken in from"
    assert f"waiting for the last drop staged, {drop.name} (generation " in out
    assert f"; {where} {layout.incoming.resolve()})" in out

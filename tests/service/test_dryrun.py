"""``boot --dry-run`` is the boot, previewed: it decides from the same host (a typo'd
``config.toml`` salvaged, ``config.invalid`` logged), and every line it prints or logs says
it is a preview, while none of the boot's own lines does."""

from __future__ import annotations

import io
import json
import shutil
import sys
import uuid
from pathlib import Path
from typing import Any

import pytest

from service import logs
from service.bundles.phase import Phase
from service.bundles.statefile import read
from service.cli import main
from service.host.running import RunningHost
from service.layout import Layout
from stager.drop import ModuleSpec, stage
from tests.hosts import KEEP, running_host
from tests.service.conftest import HostTree

PREVIEW = "preview: "


@pytest.fixture
def host(host_tree: HostTree, signed: dict[str, Path]) -> Layout:
    """A sandbox host with one pending generation of bundle ``nvidia`` (two modules)."""
    layout = host_tree()
    stage(
        layout.incoming,
        bundle="nvidia",
        version="1",
        kernel=RunningHost.read(layout).need_release(),
        modules=[ModuleSpec(signed["ms_exporter"], ""), ModuleSpec(signed["ms_params"], "")],
    )
    assert main(["intake", "--root", str(layout.root)], io.StringIO()) == 0
    logs.reset()
    assert read(layout.state).bundle("nvidia").phase is Phase.PENDING
    return layout


def command(layout: Layout, *words: str) -> tuple[int, list[str], list[dict[str, Any]]]:
    """Run ``modstage boot --root ROOT WORDS``: exit code, printed lines, logged events
    (the JSON lines main's log writes to stderr; any other stderr line, such as an error
    message, as a ``(not a log line)`` event holding its text)."""
    out, err = io.StringIO(), io.StringIO()
    saved, sys.stderr = sys.stderr, err
    try:
        code = main(["boot", "--root", str(layout.root), *words], out)
    finally:
        sys.stderr = saved
        logs.reset()
    events = [
        json.loads(x) if x.startswith("{") else {"event": "(not a log line)", "text": x}
        for x in err.getvalue().splitlines()
    ]
    return code, out.getvalue().splitlines(), events


def another_version_loaded(layout: Layout, module: str) -> None:
    """Make ``module`` live in the sandbox's sysfs with a srcversion no generation has."""
    live = layout.sys / "module" / module
    live.mkdir(parents=True)
    (live / "srcversion").write_text("0123456789ABCDEF\n")
    (live / "initstate").write_text("live\n")


def test_a_typo_in_the_config_is_salvaged_by_the_dry_run_as_by_the_boot(host: Layout) -> None:
    """With ``retian = 3`` in config.toml the dry run does not refuse: it logs the same
    ``config.invalid`` line as the boot (same path, same problems), exits as the boot does,
    and its last lines are the boot's own, each marked as a preview."""
    host.config.parent.mkdir(parents=True, exist_ok=True)
    host.config.write_text("retian = 3\n")
    dry_code, dry_lines, dry_events = command(host, "--dry-run")
    boot_code, boot_lines, boot_events = command(host)

    def invalid(events: list[dict[str, Any]]) -> list[tuple[str, list[str]]]:
        return [(e["path"], e["problems"]) for e in events if e["event"] == "config.invalid"]

    assert invalid(dry_events) == invalid(boot_events)
    [(path, problems)] = invalid(boot_events)
    assert path == str(host.config) and any("retian" in p for p in problems), problems
    assert dry_code == boot_code == 0
    ends = [line for line in boot_lines if not line.startswith("sandbox ")]
    assert ends and dry_lines[-len(ends) :] == [PREVIEW + line for line in ends]
    assert read(host.state).bundle("nvidia").phase is Phase.ACTIVE


def test_every_line_of_a_dry_run_says_it_is_a_preview_and_none_of_the_boots(
    host: Layout,
) -> None:
    """A dry run whose bundle would fail (another version of a module already loaded):
    every event it logs, ``generation.failed`` at error level included, carries
    ``preview=true`` and every line it prints starts ``preview:``; the boot that follows
    fails the same way, and none of its events or lines is marked."""
    another_version_loaded(host, "ms_params")
    host.config.parent.mkdir(parents=True, exist_ok=True)
    host.config.write_text("retian = 3\n")  # config.invalid is logged before the boot runs
    dry_code, dry_lines, dry_events = command(host, "--dry-run")
    names = {e["event"] for e in dry_events}
    assert {"config.invalid", "generation.failed"} <= names, names
    assert [e for e in dry_events if e.get("preview") is not True] == []
    assert dry_lines and [x for x in dry_lines if not x.startswith(PREVIEW)] == []

    boot_code, boot_lines, boot_events = command(host)
    assert dry_code == boot_code == 1
    assert {"config.invalid", "generation.failed"} <= {e["event"] for e in boot_events}
    assert [e for e in boot_events if "preview" in e] == []
    assert boot_lines and [x for x in boot_lines if "preview" in x] == []


def test_the_dry_run_lists_the_metrics_the_boot_retires_and_keeps_them(host: Layout) -> None:
    """The boot removes the previous boot's node-exporter textfile; the dry run names that
    removal as a preview line and leaves the file in place."""
    host.metrics.parent.mkdir(parents=True)
    host.metrics.write_text("modstage_up 1\n")
    code, lines, _ = command(host, "--dry-run")
    assert code == 0 and f"{PREVIEW}remove {host.metrics} (the previous boot's metrics)" in lines
    assert host.metrics.exists()
    assert command(host)[0] == 0
    assert not host.metrics.exists()


def play_reboot(layout: Layout) -> None:
    """A reboot of the sandbox: the recording kernel's ``sys/module`` entries of the bundle
    go, and the boot id changes (docs/sandbox.md)."""
    for name in ("ms_exporter", "ms_params"):
        shutil.rmtree(layout.sys / "module" / name)
    running_host(layout, KEEP, str(uuid.uuid4()))


def test_a_corrupt_state_is_rebuilt_by_the_dry_run_as_by_the_boot(host: Layout) -> None:
    """After a boot made ``nvidia`` active and a reboot, ``state.json`` is corrupted: the dry
    run does not refuse; it logs ``state.rebuilt`` and ends as the boot then does (the last
    known good loaded), while leaving the corrupt file where it is and setting nothing
    aside."""
    assert command(host)[0] == 0
    play_reboot(host)
    host.state.write_text("{not json")
    dry_code, dry_lines, dry_events = command(host, "--dry-run")
    assert host.state.read_text() == "{not json"
    assert sorted(p.name for p in host.state.parent.glob("state.json*")) == ["state.json"]
    boot_code, boot_lines, boot_events = command(host)
    assert [e["event"] for e in dry_events if e["event"] == "state.rebuilt"] == ["state.rebuilt"]
    assert "state.rebuilt" in {e["event"] for e in boot_events}
    (rebuilt,) = (e for e in dry_events if e["event"] == "state.rebuilt")
    assert "the boot would move it aside to" in rebuilt["reason"], rebuilt
    assert dry_code == boot_code == 0
    ends = [line for line in boot_lines if not line.startswith("sandbox ")]
    assert ends and dry_lines[-len(ends) :] == [PREVIEW + line for line in ends]
    assert read(host.state).bundle("nvidia").phase is Phase.ACTIVE

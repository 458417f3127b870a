"""``status --json`` is the contract docs/status.md writes down: on a host that shows every
section, the keys printed are exactly the keys documented, for the document and for the
status files it embeds (no golden file: the document is the reference)."""

from __future__ import annotations

import io
import json
import re
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

from service.bundles.phase import Phase
from service.bundles.records import ModuleLoad, RebootIntent
from service.bundles.state import BundleState, Generation, State
from service.bundles.statefile import read, save
from service.cli import main
from service.config import Limits
from service.layout import Layout
from service.publish import quarantine
from service.publish.bundle_status import write_status
from service.status.glance import write_heartbeat
from service.status.unloads import write_unloads
from stager.schema.record import dump
from tests.hosts import KEEP, running_host
from tests.service.test_metrics import KERNEL, fallback_host

DOC = Path(__file__).resolve().parents[2] / "docs/status.md"
ASKED = RebootIntent(1.5, "b", "kured", ("nvidia",), "r")


def documented_keys() -> tuple[set[str], set[str]]:
    """Keys of the ``--json`` schema block, and of the status file's table, in docs/status.md."""
    text = DOC.read_text()
    start = text.index("```jsonc", text.index("### `--json`, schema 1"))
    block = text[start : text.index("```", start + 8)]
    table = text[text.index("## `status/<bundle>.json`") : text.index("With `[publish]")]
    rows = [line.split("|")[1] for line in table.splitlines() if line.startswith("| `")]
    return set(re.findall(r'"([a-z_]+)":', block)) - {"nvidia"}, {
        k for row in rows for k in re.findall(r"`([a-z_]+)`", row)
    }


def keys(value: Any, skip: frozenset[str] = frozenset({"bundles", "status_file"})) -> set[str]:
    """Every key in ``value``, nested, but not the bundle names nor inside status files."""
    found: set[str] = set()
    if isinstance(value, dict):
        for k, v in value.items():
            found.add(k)
            if k == "bundles" and isinstance(v, dict):
                for b in v.values():
                    found |= keys(b)
            elif k not in skip:
                found |= keys(v)
    elif isinstance(value, list):
        for v in value:
            found |= keys(v)
    return found


def _upgrading_bundle() -> BundleState:
    """A bundle whose module was unloaded (its ``remove`` recorded) for a pending generation."""
    kernel = KERNEL
    b = BundleState().with_generation(Generation("d" * 64, "1", kernel, added=1.0))
    b = b.move(Phase.PENDING, pending="d" * 64).move(Phase.LOADING)
    b = b.move(Phase.ACTIVE, active="d" * 64, pending=None, loaded=(ModuleLoad("ice", "S9"),))
    return b.staged(Generation("e" * 64, "2", kernel, added=2.0), retain=3)


def full_host(tmp_path: Path) -> Layout:
    """A host with every section filled: bundles with generations, modules and history, a
    reboot asked for, a window, a heartbeat, a rejected drop, quarantine, memory blocks,
    an upgrade under way."""
    layout = fallback_host(tmp_path)
    state = State(read(layout.state).bundles, boot_id="boot-2", reboot=ASKED)
    nvidia = state.bundle("nvidia")
    gpu = ModuleLoad("nvidia", "abc", 1.0, pci=("pci:v000010DEd*sv*sd*bc03sc02i00*",))
    state = state.with_bundle("nvidia", replace(nvidia, loaded=(*nvidia.loaded, gpu)))
    state = state.with_bundle("ice", _upgrading_bundle())
    save(layout.state, state)
    running_host(layout, KEEP, "boot-2")
    write_unloads(layout.unloads, "boot-2", {"ice": time.time() - 60})
    device = layout.sys / "bus/pci/devices/0000:41:00.0"
    device.mkdir(parents=True)
    (device / "modalias").write_text("pci:v000010DEd00002330sv000010DEsd000016C1bc03sc02i00\n")
    layout.config.parent.mkdir(parents=True, exist_ok=True)
    layout.config.write_text('[reboot]\nbackend = "kured"\ndays = ["mon"]\nstart = "02:00"\n')
    write_heartbeat(layout.heartbeat, decision="outside the reboot window", at=1.0)
    write_status(
        layout, "nvidia", state.bundle("nvidia"), reboot=dump(ASKED), version="3", kernel="k"
    )
    write_status(layout, "amd", State().bundle("amd"), phase=Phase.REJECTED, drop="amd.1.x")
    block = layout.sys / "devices/system/memory/memory8"
    block.mkdir(parents=True)
    (block / "state").write_text("online\n")
    (block / "valid_zones").write_text("Movable\n")
    (block / "node0").mkdir()
    (tmp_path / "boot").mkdir(exist_ok=True)
    (tmp_path / f"boot/vmlinuz-{KERNEL}").write_bytes(b"MZ")  # an installed kernel
    drop = layout.incoming / "nvidia.1.zz"
    drop.mkdir(parents=True)
    quarantine.put(layout, drop, "nvidia", ["bad"], Limits())
    return layout


def test_json_keys_are_the_documented_keys(tmp_path: Path) -> None:
    """Every key ``status --json`` prints is documented, and every documented key is printed."""
    full_host(tmp_path)
    out = io.StringIO()
    main(["status", "--root", str(tmp_path), "--json"], out)
    doc = json.loads(out.getvalue())
    schema, status_file = documented_keys()
    assert keys(doc) == schema
    files = [doc["bundles"][b]["status_file"] for b in ("nvidia", "amd")]
    assert {k for f in files for k in f} == status_file
    assert files[0]["reboot"] == dump(ASKED)

"""``modstage status``: what an admin (or a monitor) needs to know, read without a daemon.

:func:`collect` reads ``state.json``, the status files, the host config and
sysfs, and returns the document ``status --json`` prints (schema in
``docs/status.md``). Whether a bundle is healthy is decided by
:func:`bundle_health` from plain values; nothing here writes anything, so a
corrupt state file is reported, not moved aside.
"""

from __future__ import annotations

import argparse
import json
import re
from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from enum import IntEnum
from pathlib import Path
from typing import Any, TextIO

from service.config import Config
from service.errors import ConfigError, StateError
from service.kernel.memory import MEMORY
from service.layout import Layout
from service.reboot import reboot_required
from service.store.state import BundleState, Phase, State, read

SCHEMA = 1
_NODE = re.compile(r"node(\d+)\Z")


class Health(IntEnum):
    """How a bundle (or the host) is doing; the value is ``status``'s exit code."""

    HEALTHY = 0
    DEGRADED = 1
    FAILED = 2

    @property
    def label(self) -> str:
        """The lowercase name used in JSON and tables."""
        return self.name.lower()


@dataclass(frozen=True)
class Verdict:
    """A health and the reasons for it, in plain words."""

    health: Health
    reasons: tuple[str, ...] = ()


def bundle_health(
    bundle: BundleState | None,
    status_doc: Mapping[str, Any] | None,
    *,
    kernel: str | None,
    boot_id: str | None = None,
    state_boot_id: str | None = None,
) -> Verdict:
    """Judge one bundle from its state and its last status file.

    failed: the bundle's last load failed and nothing of it is loaded.
    degraded: a generation newer than the active one failed (the last known
    good runs), the last drop was rejected, the active generation targets
    another kernel, or a load started in an earlier boot never finished.
    """
    found: list[tuple[Health, str]] = []
    if status_doc is not None and status_doc.get("phase") == Phase.REJECTED.value:
        why = "; ".join(map(str, status_doc.get("errors") or ())) or "no reason given"
        found.append((Health.DEGRADED, f"the last drop was rejected: {why}"))
    if bundle is not None:
        active = bundle.generations.get(bundle.active) if bundle.active else None
        if bundle.phase is Phase.FAILED:
            note = next((h.get("note") for h in reversed(bundle.history) if h.get("note")), None)
            found.append((Health.FAILED, f"nothing is loaded: {note or 'the last load failed'}"))
        since = active.added if active is not None else float("-inf")
        for gen in sorted(bundle.generations.values(), key=lambda g: g.added):
            if gen.failed and gen.added >= since and gen.id != bundle.active:
                runs = f"running {active.id[:12]}" if active else "no generation is active"
                found.append(
                    (
                        Health.DEGRADED,
                        f"generation {gen.id[:12]} ({gen.version}) failed: {gen.failed}; {runs}",
                    )
                )
        if active is not None and kernel is not None and active.kernel != kernel:
            found.append(
                (
                    Health.DEGRADED,
                    f"the active generation targets kernel {active.kernel}, "
                    f"running {kernel}: its modules are not loaded",
                )
            )
        if bundle.phase is Phase.LOADING and boot_id and state_boot_id and boot_id != state_boot_id:
            found.append(
                (
                    Health.DEGRADED,
                    "a load started in an earlier boot never finished; the next boot retries it",
                )
            )
    return Verdict(max((h for h, _ in found), default=Health.HEALTHY), tuple(r for _, r in found))


def overall(healths: Iterable[Health]) -> Health:
    """The host's health: the worst of its parts (healthy when there are none)."""
    return max(healths, default=Health.HEALTHY)


def read_state(path: Path) -> State:
    """``state.read`` with I/O errors as :class:`StateError` (status reports, never moves)."""
    try:
        return read(path)
    except OSError as exc:
        raise StateError(f"{path}: cannot read: {exc.strerror}") from exc


def _read_text(path: Path) -> str | None:
    try:
        return path.read_text().strip()
    except OSError:
        return None


def status_docs(directory: Path) -> dict[str, dict[str, Any]]:
    """Every readable ``<bundle>.json`` status file, by bundle name."""
    docs: dict[str, dict[str, Any]] = {}
    for path in sorted(directory.glob("*.json")) if directory.is_dir() else ():
        try:
            doc = json.loads(path.read_bytes())
        except (OSError, ValueError):
            continue
        if isinstance(doc, dict):
            docs[path.stem] = doc
    return docs


def memory_summary(sys_root: Path) -> list[dict[str, Any]]:
    """Memory blocks counted by NUMA node, zone (online blocks only) and state."""
    counts: Counter[tuple[int | None, str | None, str]] = Counter()
    base = sys_root / MEMORY
    for entry in sorted(base.glob("memory[0-9]*")) if base.is_dir() else ():
        state = _read_text(entry / "state")
        if state is None:
            continue
        node = next((int(m.group(1)) for p in entry.iterdir() if (m := _NODE.match(p.name))), None)
        zones = (_read_text(entry / "valid_zones") or "").split()
        zone = zones[0] if state == "online" and zones else None
        counts[(node, zone, state)] += 1
    return [
        {"node": n, "zone": z, "state": s, "blocks": c}
        for (n, z, s), c in sorted(
            counts.items(),
            key=lambda kv: (kv[0][0] is None, kv[0][0] or 0, kv[0][2], kv[0][1] or ""),
        )
    ]


def _bundle_doc(
    bundle: BundleState | None, status_doc: dict[str, Any] | None, verdict: Verdict
) -> dict[str, Any]:
    b = bundle if bundle is not None else BundleState()
    roles = {b.active: "active", b.pending: "pending"}
    gens = sorted(b.generations.values(), key=lambda g: g.added)
    errors = list((status_doc or {}).get("errors") or ())
    errors += [f"{g.id[:12]}: {g.failed}" for g in gens if g.failed]
    return {
        "phase": b.phase.value
        if bundle is not None
        else (status_doc or {}).get("phase", b.phase.value),
        "health": verdict.health.label,
        "reasons": list(verdict.reasons),
        "active": b.active,
        "pending": b.pending,
        "generations": [
            {
                "id": g.id,
                "version": g.version,
                "kernel": g.kernel,
                "added": g.added,
                "attempts": g.attempts,
                "failed": g.failed,
                "role": roles.get(g.id) or ("failed" if g.failed else "retained"),
            }
            for g in gens
        ],
        "loaded": [
            {
                "module": m.get("module"),
                "srcversion": m.get("srcversion"),
                "ms": m.get("ms"),
                "already_loaded": bool(m.get("already_loaded")),
            }
            for m in b.loaded
        ],
        "history": [
            {"at": h.get("at"), "from": h.get("from"), "to": h.get("to"), "note": h.get("note")}
            for h in b.history
        ],
        "status_file": status_doc,
        "errors": errors,
    }


def collect(layout: Layout) -> dict[str, Any]:
    """The ``status --json`` document (schema :data:`SCHEMA`) for the host under ``layout``."""
    problems: list[dict[str, Any]] = []
    kernel, boot_id = _read_text(layout.os_release), _read_text(layout.boot_id)
    state_error = None
    try:
        state = read_state(layout.state)
    except StateError as exc:
        state, state_error = State(), str(exc)
        problems.append({"bundle": None, "health": "failed", "reason": state_error})
    config, sentinel = Config(), layout.reboot_sentinel
    try:
        config = Config.load(layout.config)
    except ConfigError as exc:
        problems.append({"bundle": None, "health": "degraded", "reason": str(exc)})
    if config.reboot.sentinel is not None:
        sentinel = layout.root / str(config.reboot.sentinel).lstrip("/")
    docs = status_docs(layout.status)
    bundles: dict[str, Any] = {}
    healths = [Health.FAILED] if state_error else []
    for name in sorted(set(state.bundles) | set(docs)):
        verdict = bundle_health(
            state.bundles.get(name),
            docs.get(name),
            kernel=kernel,
            boot_id=boot_id,
            state_boot_id=state.boot_id,
        )
        healths.append(verdict.health)
        problems += [
            {"bundle": name, "health": verdict.health.label, "reason": r} for r in verdict.reasons
        ]
        bundles[name] = _bundle_doc(state.bundles.get(name), docs.get(name), verdict)
    if any(p["bundle"] is None and p["health"] == "degraded" for p in problems):
        healths.append(Health.DEGRADED)
    health = overall(healths)
    window = config.reboot.window
    return {
        "schema": SCHEMA,
        "health": health.label,
        "exit_code": int(health),
        "kernel": kernel,
        "boot_id": boot_id,
        "state": {"path": str(layout.state), "error": state_error, "boot_id": state.boot_id},
        "reboot": {
            "required": bool(waiting := reboot_required(state, kernel or "")),
            "bundles": waiting,
            "scheduled": [
                n for n, b in sorted(state.bundles.items()) if b.phase is Phase.REBOOT_SCHEDULED
            ],
            "asked": state.reboot,  # the daemon's recorded request: at, boot_id, backend, ...
            "backend": config.reboot.backend,
            "window": {
                "days": list(window.days),
                "start": window.start.isoformat(),
                "end": window.end.isoformat(),
                "timezone": window.timezone,
            },
            "sentinel": {"path": str(sentinel), "present": sentinel.exists()},
        },
        "problems": problems,
        "bundles": bundles,
        "memory": memory_summary(layout.sys),
    }


def run(args: argparse.Namespace, out: TextIO) -> int:
    """``modstage status``: print the status; exit 0 healthy, 1 degraded, 2 failed."""
    layout = Layout(args.root)
    if args.reboot_required:  # kured's sentinel command: exit 0, 1, or 3 on any error
        import sys

        from service.status import required

        return required.run(layout, out, sys.stderr)
    doc = collect(layout)
    if args.json:
        print(json.dumps(doc, indent=2, sort_keys=True), file=out)
    else:
        from service.status.view import render

        render(doc, out)
    return int(doc["exit_code"])

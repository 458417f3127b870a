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
import time
from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from enum import IntEnum
from pathlib import Path
from typing import Any, TextIO

from service.config import Config
from service.errors import ConfigError, StateError
from service.kernel.memory import MEMORY
from service.layout import Layout
from service.reboot import reboot_required
from service.status.glance import iso, next_open, read_heartbeat, why_no_reboot
from service.status.live import LiveModule, live_modules, module_mismatches
from service.store import quarantine
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
    live: Mapping[str, LiveModule | None] | None = None,
) -> Verdict:
    """Judge one bundle from its state and its last status file.

    failed: the bundle's last load failed and nothing of it is loaded.
    degraded: a generation newer than the active one failed (the last known
    good runs), the last drop was rejected, the active generation targets
    another kernel, or a load started in an earlier boot never finished.
    With ``live`` (the kernel's view of the recorded modules): failed when a
    module recorded as loaded is not live, degraded when another build of it
    is, or when ``modstage boot`` did not run in this boot.
    """
    found: list[tuple[Health, str]] = []
    if status_doc is not None and status_doc.get("phase") == Phase.REJECTED.value:
        why = "; ".join(map(str, status_doc.get("errors") or ())) or "no reason given"
        found.append((Health.DEGRADED, f"the last drop was rejected: {why}"))
    if bundle is not None:
        active = bundle.generations.get(bundle.active) if bundle.active else None
        if bundle.phase is Phase.FAILED:
            note = next((h.note for h in reversed(bundle.history) if h.note), None)
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
        if active is not None and (kernel is None or active.kernel == kernel) and live is not None:
            found += _live_findings(bundle, live, boot_id, state_boot_id)
        if bundle.phase is Phase.LOADING and boot_id and state_boot_id and boot_id != state_boot_id:
            found.append(
                (
                    Health.DEGRADED,
                    "a load started in an earlier boot never finished; the next boot retries it",
                )
            )
    return Verdict(max((h for h, _ in found), default=Health.HEALTHY), tuple(r for _, r in found))


def _live_findings(
    bundle: BundleState,
    live: Mapping[str, LiveModule | None],
    boot_id: str | None,
    state_boot_id: str | None,
) -> list[tuple[Health, str]]:
    """What the kernel contradicts in the record of the active generation."""
    found: list[tuple[Health, str]] = []
    missing, differing = module_mismatches([m.to_json() for m in bundle.loaded], live)
    gen = str(bundle.active)[:12]
    if missing:
        found.append(
            (
                Health.FAILED,
                f"generation {gen} is recorded active but module(s) {', '.join(missing)} "
                "are not loaded in the running kernel",
            )
        )
    if differing:
        found.append(
            (Health.DEGRADED, f"another build is loaded than recorded: {', '.join(differing)}")
        )
    stale = boot_id and state_boot_id and boot_id != state_boot_id
    if stale and bundle.phase is Phase.ACTIVE:
        found.append(
            (
                Health.DEGRADED,
                f"modstage boot has not run in this boot (state was written in boot "
                f"{state_boot_id}, this is {boot_id})",
            )
        )
    return found


def overall(healths: Iterable[Health]) -> Health:
    """The host's health: the worst of its parts (healthy when there are none)."""
    return max(healths, default=Health.HEALTHY)


def read_state(path: Path) -> State:
    """``state.read`` with I/O errors as :class:`StateError` (status reports, never moves)."""
    try:
        return read(path)
    except OSError as exc:
        raise StateError(f"{path}: cannot read: {exc.strerror}") from exc
    except StateError as exc:
        raise StateError(f"{path}: {exc}") from exc


def _read_text(path: Path) -> str | None:
    try:
        return path.read_text().strip()
    except OSError:
        return None


def status_docs(directory: Path) -> dict[str, dict[str, Any]]:
    """Every readable ``<bundle>.json`` status file, by bundle name."""
    return {k: v for k, v in read_status_files(directory).items() if isinstance(v, dict)}


def read_status_files(directory: Path) -> dict[str, dict[str, Any] | str]:
    """Every ``<bundle>.json`` status file by bundle: its document, or why it is garbled."""
    docs: dict[str, dict[str, Any] | str] = {}
    for path in sorted(directory.glob("*.json")) if directory.is_dir() else ():
        try:
            doc = json.loads(path.read_bytes())
        except (OSError, ValueError) as exc:
            docs[path.stem] = f"status file {path} is garbled ({exc}): the last outcome is unknown"
            continue
        if isinstance(doc, dict):
            docs[path.stem] = doc
        else:
            docs[path.stem] = f"status file {path} is not a JSON object: last outcome unknown"
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


def waiting_note(bundle: BundleState, kernel: str | None) -> str | None:
    """Why the bundle's pending generation does not load at the next boot, if it does not."""
    gen = bundle.generations.get(bundle.pending) if bundle.pending else None
    if gen is None or gen.failed:
        return None
    if kernel is not None and gen.kernel != kernel:
        return f"waiting for kernel {gen.kernel} (running {kernel})"
    if bundle.held:
        return "held by an admin: no reboot is asked (modstage release)"
    return None


def _bundle_doc(
    bundle: BundleState | None,
    status_doc: dict[str, Any] | None,
    verdict: Verdict,
    *,
    kernel: str | None,
    live: Mapping[str, LiveModule | None],
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
        "last_known_good": b.last_known_good,
        "held": b.held,
        "waiting": waiting_note(b, kernel),
        "generations": [
            {
                "id": g.id,
                "version": g.version,
                "kernel": g.kernel,
                "added": g.added,
                "added_utc": iso(g.added),
                "attempts": g.attempts,
                "failed": g.failed,
                "role": roles.get(g.id) or ("failed" if g.failed else "retained"),
            }
            for g in gens
        ],
        "loaded": [_loaded(m.to_json(), live) for m in b.loaded],
        "history": [
            {
                "at": h.at,
                "at_utc": iso(h.at),
                "from": h.source,
                "to": h.target,
                "note": h.note or None,
            }
            for h in b.history
        ],
        "status_file": status_doc,
        "errors": errors,
    }


def _loaded(m: Mapping[str, Any], live: Mapping[str, LiveModule | None]) -> dict[str, Any]:
    now = live.get(str(m.get("module")))
    return {
        "module": m.get("module"),
        "srcversion": m.get("srcversion"),
        "ms": m.get("ms"),
        "already_loaded": bool(m.get("already_loaded")),
        "live": None
        if now is None
        else {"srcversion": now.srcversion, "version": now.version, "refcnt": now.refcnt},
    }


def _state(layout: Layout) -> tuple[State, str | None, list[tuple[Health, str]]]:
    """The state, its error, and host problems (a corrupt file set aside, then rebuilt)."""
    try:
        state, error = read_state(layout.state), None
    except StateError as exc:
        return State(), str(exc), [(Health.FAILED, str(exc))]
    aside = sorted(layout.state.parent.glob(f"{layout.state.name}.corrupt-*"))
    if not aside:
        return state, error, []
    if not layout.state.exists():
        error = (
            f"{layout.state} is missing: an earlier state file was corrupt and is set aside "
            f"at {aside[-1]}; the next boot rebuilds the last known good from the store"
        )
        return state, error, [(Health.FAILED, error)]
    why = (
        f"{layout.state} was rebuilt after it was found corrupt; the corrupt file is kept "
        f"at {aside[-1]}: inspect it, then remove it"
    )
    return state, error, [(Health.DEGRADED, why)]


def _config(layout: Layout) -> tuple[Config | None, str | None]:
    try:
        return Config.load(layout.config), None
    except ConfigError as exc:
        return None, f"{exc}: the daemon and intake refuse to start; boot uses defaults"


def _reboot(
    layout: Layout,
    state: State,
    config: Config | None,
    kernel: str | None,
    bundles: Mapping[str, Mapping[str, Any]],
    daemon: dict[str, Any],
    now: float,
) -> dict[str, Any]:
    sentinel = layout.reboot_sentinel
    if config is not None and config.reboot.sentinel is not None:
        sentinel = layout.root / str(config.reboot.sentinel).lstrip("/")
    waiting = reboot_required(state, kernel or "")
    moment = datetime.fromtimestamp(now, UTC)
    window = config.reboot.window if config is not None else None
    opens = next_open(window, moment) if window is not None else None
    waits = [f"{n}: {b['waiting']}" for n, b in bundles.items() if b.get("waiting")]
    asked = state.reboot.to_json() if state.reboot is not None else None
    return {
        "required": bool(waiting),
        "bundles": waiting,
        "scheduled": [
            n for n, b in sorted(state.bundles.items()) if b.phase is Phase.REBOOT_SCHEDULED
        ],
        "asked": asked,  # the daemon's recorded request: at, boot_id, backend, ...
        "backend": config.reboot.backend if config is not None else None,
        "window": None
        if window is None
        else {
            "days": list(window.days),
            "start": window.start.isoformat(),
            "end": window.end.isoformat(),
            "timezone": window.timezone,
        },
        "next_window": iso(opens.timestamp()) if opens is not None else None,
        "window_open": opens is not None and opens <= moment,
        "why_not_asked": why_no_reboot(
            required=bool(waiting),
            asked=asked,
            backend=config.reboot.backend if config is not None else None,
            daemon=daemon,
            opens=opens,
            now=moment,
            waits=waits,
        ),
        "sentinel": {"path": str(sentinel), "present": sentinel.exists()},
    }


def collect(layout: Layout, *, now: float | None = None) -> dict[str, Any]:
    """The ``status --json`` document (schema :data:`SCHEMA`) for the host under ``layout``."""
    now = time.time() if now is None else now
    kernel, boot_id = _read_text(layout.os_release), _read_text(layout.boot_id)
    state, state_error, host = _state(layout)
    config, config_error = _config(layout)
    if config_error:
        host.append((Health.DEGRADED, config_error))
    problems = [{"bundle": None, "health": h.label, "reason": r} for h, r in host]
    files = read_status_files(layout.status)
    bundles: dict[str, Any] = {}
    healths = [h for h, _ in host]
    for name in sorted(set(state.bundles) | set(files)):
        b, entry = state.bundles.get(name), files.get(name)
        doc = entry if isinstance(entry, dict) else None
        live = live_modules(layout.sys, [m.module for m in b.loaded] if b else [])
        verdict = bundle_health(
            b, doc, kernel=kernel, boot_id=boot_id, state_boot_id=state.boot_id, live=live
        )
        if isinstance(entry, str):
            verdict = Verdict(max(verdict.health, Health.DEGRADED), (*verdict.reasons, entry))
        healths.append(verdict.health)
        problems += [
            {"bundle": name, "health": verdict.health.label, "reason": r} for r in verdict.reasons
        ]
        bundles[name] = _bundle_doc(b, doc, verdict, kernel=kernel, live=live)
    health = overall(healths)
    daemon = read_heartbeat(layout.heartbeat, now)
    return {
        "schema": SCHEMA,
        "health": health.label,
        "exit_code": int(health),
        "kernel": kernel,
        "boot_id": boot_id,
        "generated_utc": iso(now),
        "state": {"path": str(layout.state), "error": state_error, "boot_id": state.boot_id},
        "config": {"path": str(layout.config), "error": config_error},
        "daemon": daemon,
        "reboot": _reboot(layout, state, config, kernel, bundles, daemon, now),
        "problems": problems,
        "bundles": bundles,
        "memory": memory_summary(layout.sys),
        "quarantine": [r.to_dict() for r in quarantine.records(layout)],
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

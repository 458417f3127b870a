"""Prometheus metrics as a node-exporter textfile, rewritten on every change.

:func:`families` turns the ``status`` report into metric families (plain
values, no I/O); :func:`render` writes them in the text exposition format;
:func:`write_metrics` does both and persists the file with the one crash-safe
write, so node-exporter never reads half a file. It reads the report with
:func:`~service.status.survey.survey` and no signers, the one part of ``status``
no metric shows: the daemon, which writes the file after every scan, never
imports the verify stack.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from service.bundles.phase import Phase
from service.layout import Layout
from service.status.health import Health
from service.status.report import BundleReport, Report
from service.status.survey import survey
from stager.schema.atomic import write_atomic

Labels = dict[str, str]


@dataclass(frozen=True)
class Family:
    """One gauge: its name, help text and samples (labels, value)."""

    name: str
    help: str
    samples: list[tuple[Labels, float]] = field(default_factory=list)


_HELP = {
    "modstage_health": (
        "Host health: 0 healthy, 1 degraded, 2 failed, 4 upgrading (status exit code)."
    ),
    "modstage_grade": "1 for the host's health (healthy, upgrading, degraded, failed), 0 else.",
    "modstage_state_readable": "1 if state.json could be read.",
    "modstage_reboot_required": "1 if a pending generation waits for a reboot.",
    "modstage_reboot_held": (
        "1 if a wanted reboot waits because the next kernel lacks a bundle's generation."
    ),
    "modstage_bundle_health": "Bundle health: 0 healthy, 1 degraded, 2 failed, 4 upgrading.",
    "modstage_bundle_next_kernel_missing": (
        "1 if the next boot runs another kernel and the bundle has no generation for it."
    ),
    "modstage_bundle_grade": "1 for the bundle's health, 0 for the others.",
    "modstage_bundle_driverless_seconds": (
        "Seconds an upgrading bundle has been without its driver (absent: it is not)."
    ),
    "modstage_bundle_upgrading_limit_seconds": (
        "How long an upgrading bundle may be without its driver before it is failed."
    ),
    "modstage_bundle_phase": "1 for the phase the bundle is in, 0 for the others.",
    "modstage_bundle_reboot_required": "1 if the bundle waits for a reboot.",
    "modstage_bundle_failed_generations": "Failed generations the state remembers.",
    "modstage_bundle_boot_attempts": "Boot attempts of the pending generation.",
    "modstage_bundle_load_seconds": "Time the active generation's modules took.",
    "modstage_module_load_seconds": "finit_module time of each loaded module.",
    "modstage_bundle_last_transition_timestamp_seconds": "Time of the last move.",
    "modstage_verification_seconds": (
        "Seconds the last intake of the bundle's drop took (copy and verification)."
    ),
    "modstage_memory_blocks": "Memory blocks by NUMA node, zone and state.",
    "modstage_bundle_info": (
        "Always 1; labels name the active (last known good) and pending versions."
    ),
    "modstage_daemon_heartbeat_age_seconds": (
        "Seconds since the daemon's last heartbeat (absent: no heartbeat)."
    ),
}
Samples = dict[str, list[tuple[Labels, float]]]


def families(doc: Report, verification: Mapping[str, float] | None = None) -> list[Family]:
    """The metrics for a ``status`` report; ``verification``: seconds per bundle, if known."""
    fams = [Family(name, text) for name, text in _HELP.items()]
    by: Samples = {f.name: f.samples for f in fams}
    by["modstage_health"].append(({}, float(doc.health.code)))
    for grade in Health:
        by["modstage_grade"].append(({"health": grade.label}, float(doc.health is grade)))
    by["modstage_state_readable"].append(({}, 0.0 if doc.state_error else 1.0))
    by["modstage_reboot_required"].append(({}, float(doc.reboot.required)))
    by["modstage_reboot_held"].append(({}, float(doc.reboot.held)))
    for name, b in doc.bundles.items():
        _bundle_samples(by, name, b, waiting=name in doc.reboot.bundles)
        missing = name in doc.reboot.driverless
        next_labels = {"bundle": name, "kernel": doc.reboot.next_kernel or ""}
        by["modstage_bundle_next_kernel_missing"].append((next_labels, float(missing)))
    for name, seconds in sorted((verification or {}).items()):
        by["modstage_verification_seconds"].append(({"bundle": name}, seconds))
    if doc.daemon.age_seconds is not None:
        by["modstage_daemon_heartbeat_age_seconds"].append(({}, float(doc.daemon.age_seconds)))
    for m in doc.memory:
        labels = {"node": "" if m.node is None else str(m.node), "zone": m.zone or ""}
        by["modstage_memory_blocks"].append(({**labels, "state": m.state}, float(m.blocks)))
    return fams


def _bundle_samples(by: Samples, name: str, b: BundleReport, *, waiting: bool) -> None:
    """Append one bundle's samples to the families in ``by``."""
    bl = {"bundle": name}
    by["modstage_bundle_health"].append((bl, float(b.health.code)))
    for grade in Health:
        grade_labels = {**bl, "health": grade.label}
        by["modstage_bundle_grade"].append((grade_labels, float(b.health is grade)))
    if b.upgrading is not None:
        by["modstage_bundle_driverless_seconds"].append((bl, b.upgrading.seconds))
        by["modstage_bundle_upgrading_limit_seconds"].append((bl, b.upgrading.limit_seconds))
    for phase in Phase:
        by["modstage_bundle_phase"].append(
            ({**bl, "phase": phase.value}, float(b.phase == phase.value))
        )
    by["modstage_bundle_reboot_required"].append((bl, float(waiting)))
    failed = sum(1 for g in b.generations if g.failed)
    by["modstage_bundle_failed_generations"].append((bl, float(failed)))
    pending = [g.attempts for g in b.generations if g.id == b.pending]
    by["modstage_bundle_boot_attempts"].append((bl, float(sum(pending))))
    timed = [(m.module, m.ms) for m in b.loaded if not m.already_loaded and m.ms is not None]
    by["modstage_bundle_load_seconds"].append((bl, sum(ms for _, ms in timed) / 1000))
    for module, ms in timed:
        by["modstage_module_load_seconds"].append(({**bl, "module": module}, ms / 1000))
    by["modstage_bundle_info"].append(({**bl, **_versions(b)}, 1.0))
    if b.history:
        by["modstage_bundle_last_transition_timestamp_seconds"].append(
            (bl, float(b.history[-1].at or 0))
        )


def _versions(bundle: BundleReport) -> Labels:
    """``active_version``/``pending_version`` labels (empty when there is none)."""
    by_id = {g.id: g.version for g in bundle.generations}
    return {
        "active_version": by_id.get(bundle.active or "", ""),
        "pending_version": by_id.get(bundle.pending or "", ""),
    }


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def render(fams: Iterable[Family]) -> bytes:
    """The text exposition format (``# HELP``, ``# TYPE``, one sample a line).

    Written here, not with prometheus-client: importing it costs a node's metrics writer
    ~20 ms and the daemon several MiB; the tests parse the output with prometheus-client's
    own parser and compare it with its renderer.
    """
    out: list[str] = []
    for f in fams:
        out += [f"# HELP {f.name} {f.help}", f"# TYPE {f.name} gauge"]
        for labels, value in f.samples:
            inner = ",".join(f'{k}="{_escape(v)}"' for k, v in labels.items())
            out.append(
                f"{f.name}{{{inner}}} {float(value)!r}" if inner else f"{f.name} {float(value)!r}"
            )
    return ("\n".join(out) + "\n").encode()


def write_metrics(
    layout: Layout, path: Path, *, verification: Mapping[str, float] | None = None
) -> None:
    """Write the textfile for the host under ``layout`` to ``path`` (e.g. ``modstage.prom``)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    write_atomic(path, render(families(survey(layout), verification)))

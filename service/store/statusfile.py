"""``status/<bundle>.json``: what a bundle's container may read back about its drops.

The directory is mounted read-only into containers; ``modstage wait`` reads it.
Written with the one crash-safe write, so a reader never sees half a file.
"""

from __future__ import annotations

import json
import time
from typing import Any

from service.layout import Layout
from service.store.state import BundleState, Phase
from stager.atomic import write_atomic


def write_status(
    layout: Layout,
    bundle: str,
    state: BundleState,
    *,
    phase: Phase | None = None,
    generation: str | None = None,
    errors: list[str] | None = None,
    **extra: Any,
) -> dict[str, Any]:
    """Write the bundle's status: its persisted state plus what the last step found."""
    pending = state.generations.get(state.pending) if state.pending else None
    doc: dict[str, Any] = {
        "bundle": bundle,
        "phase": (phase or state.phase).value,
        "generation": generation or state.pending or state.active,
        "active": state.active,
        "pending": state.pending,
        "failed": {g.id: g.failed for g in state.generations.values() if g.failed},
        "errors": errors or [],
        "updated": round(time.time(), 3),
        "pending_kernel": pending.kernel if pending else None,
        "running_kernel": _release(layout),
        **extra,
    }
    layout.status.mkdir(parents=True, exist_ok=True)
    write_atomic(
        layout.status / f"{bundle}.json", json.dumps(doc, indent=1, sort_keys=True).encode() + b"\n"
    )
    return doc


def _release(layout: Layout) -> str | None:
    """The running kernel (``wait`` tells a generation for another kernel by it)."""
    try:
        return layout.kernel_release()
    except OSError:
        return None

"""``status/<bundle>.json``: what a bundle's container may read back about its drops.

The directory is mounted read-only into containers; ``modstage wait`` reads it.
The file's type, :class:`stager.schema.statusfile.StatusFile`, is shared with those readers.
Written with the one crash-safe write, so a reader never sees half a file.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import Any

from service.bundles.phase import Phase
from service.bundles.state import BundleState
from service.host.running import RunningHost
from service.layout import Layout
from stager.schema.atomic import write_atomic
from stager.schema.statusfile import StatusFile, StatusFileError

MAX_REJECTED = 16  # refused (and taken) drops a status file remembers (the newest)


def write_status(
    layout: Layout,
    bundle: str,
    state: BundleState,
    *,
    phase: Phase | None = None,
    generation: str | None = None,
    errors: list[str] | None = None,
    drop: str | None = None,
    version: str | None = None,
    kernel: str | None = None,
    reboot: Mapping[str, Any] | None = None,
    taken: str | None = None,
) -> StatusFile:
    """Write the bundle's status: its persisted state plus what the last step found.

    ``drop`` names a rejected drop, ``version``/``kernel`` the generation intake took
    in, ``reboot`` the daemon's recorded request; each is written only when given.
    ``taken`` names the drop intake took in as ``generation``: the file keeps it in
    ``taken`` (drop -> generation) as it keeps refused drops in ``rejected``.
    """
    pending = state.generations.get(state.pending) if state.pending else None
    before = _before(layout, bundle)
    running = RunningHost.read(layout)  # the kernel and boot this file is written in
    status = StatusFile(
        bundle=bundle,
        phase=(phase or state.phase).value,
        generation=generation or state.pending or state.active,
        active=state.active,
        pending=state.pending,
        failed=_failed(state),
        errors=tuple(errors or ()),
        updated=round(time.time(), 3),
        pending_kernel=pending.kernel if pending else None,
        running_kernel=running.release,
        drop=drop,
        version=version,
        kernel=kernel,
        reboot=reboot,
        held=state.held,
        rejected=_rejected(before, phase, drop, errors),
        taken=_taken(before, taken, generation),
        boot_id=running.boot_id,
        live=_live(layout, state, running.release),
    )
    layout.status.mkdir(parents=True, exist_ok=True)
    write_atomic(layout.status / f"{bundle}.json", status.to_json())
    return status


def _failed(state: BundleState) -> dict[str, str]:
    """The failed generations, and a refused drop's generation while it is recorded (its
    driver pod's ``wait`` reads the refusal from every later status file, the one that
    shows the reboot asked for the last good generation included)."""
    failed = {g.id: g.failed for g in state.generations.values() if g.failed}
    refused = state.refused
    if refused is not None and refused.generation and refused.generation not in failed:
        failed[refused.generation] = f"refused at intake: {refused.reason}"
    return failed


def _before(layout: Layout, bundle: str) -> StatusFile | None:
    """The bundle's status file as this write finds it (None: absent or garbled)."""
    try:
        return StatusFile.read(layout.status / f"{bundle}.json")
    except StatusFileError:
        return None  # a garbled one: status names it; the next write replaces it


def _rejected(
    before: StatusFile | None, phase: Phase | None, drop: str | None, errors: list[str] | None
) -> dict[str, str]:
    """The bundle's refused drops, as the status file before this write named them, with
    ``drop`` added when this write is its rejection (the newest :data:`MAX_REJECTED`)."""
    rejected = dict(before.rejected) if before is not None else {}
    if phase is Phase.REJECTED and drop is not None:
        rejected.pop(drop, None)
        rejected[drop] = (errors or ["rejected"])[0]
    return dict(list(rejected.items())[-MAX_REJECTED:])


def _taken(before: StatusFile | None, drop: str | None, generation: str | None) -> dict[str, str]:
    """The drops intake took in (drop -> generation), as the file before this write named
    them, with ``drop`` added (the newest :data:`MAX_REJECTED`)."""
    taken = dict(before.taken or {}) if before is not None else {}
    if drop is not None and generation is not None:
        taken.pop(drop, None)
        taken[drop] = generation
    return dict(list(taken.items())[-MAX_REJECTED:])


def _live(layout: Layout, state: BundleState, running: str | None) -> bool | None:
    """Whether every module the active generation loaded is live now (False when it
    targets another kernel than the ``running`` one; None: nothing active, or an ``active``
    bundle with nothing recorded loaded, a state written before loads were recorded;
    False: nothing recorded loaded in any other phase, since a boot that loaded nothing of
    it (no generation for its kernel, a failed load) leaves no record, whatever a later drop
    or verb moved the phase to)."""
    if state.active is None:
        return None
    active = state.generations.get(state.active)
    if active is not None and running is not None and active.kernel != running:
        return False  # its modules cannot be live on another kernel
    if not state.loaded:
        return None if state.phase is Phase.ACTIVE else False
    return all((layout.sys / "module" / m.module / "initstate").exists() for m in state.loaded)

"""When the kernel last saw a module go: the daemon's record of module ``remove`` uevents.

The kernel announces every module it unloads (``delete_module``, as the driver pod's init
container does before an upgrade, or an admin's ``rmmod``) with a ``remove`` uevent of the
``module`` subsystem; a module that comes back announces ``add``. The daemon's uevent
listener passes both to the loop, which keeps ``/run/modstage/unloads.json``: the wall time
each module left the kernel in this boot (``/run`` is empty after a reboot, and the file
names its boot id besides). ``status`` reads it to say how long a bundle has been without
its driver and that its modules left by an unload. Without a daemon nothing is recorded
and the time is unknown.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from pathlib import Path

from stager.schema.atomic import write_atomic

MAX_MODULES = 256  # the file never grows past this many names (oldest dropped)


def read_unloads(path: Path, boot_id: str | None) -> dict[str, float]:
    """Each module's unload time (epoch seconds) recorded in boot ``boot_id``; {} when the
    file is absent, unreadable, or from another boot."""
    try:
        doc = json.loads(path.read_bytes())
    except (OSError, ValueError):
        return {}
    if not isinstance(doc, dict) or boot_id is None or doc.get("boot_id") != boot_id:
        return {}
    modules = doc.get("modules")
    if not isinstance(modules, dict):
        return {}
    return {
        str(k): float(v)
        for k, v in modules.items()
        if isinstance(v, int | float) and not isinstance(v, bool)
    }


def updated(
    before: Mapping[str, float], changes: Iterable[tuple[str, str]], at: float
) -> dict[str, float]:
    """The record after ``changes`` (``(action, module)`` in the order the kernel sent
    them): a ``remove`` records ``at`` for the module, an ``add`` clears it."""
    out = dict(before)
    for action, name in changes:
        out.pop(name, None)
        if action == "remove":
            out[name] = at
    return dict(list(out.items())[-MAX_MODULES:])


def write_unloads(path: Path, boot_id: str | None, modules: Mapping[str, float]) -> None:
    """Persist the record (the one crash-safe write)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    doc = {"boot_id": boot_id, "modules": dict(modules)}
    write_atomic(path, json.dumps(doc, sort_keys=True).encode() + b"\n")

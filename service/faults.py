"""Fault injection for the crash tests: die by ``SIGKILL`` at a named persisted step.

Off unless ``MODSTAGE_FAULT=<point>[:<n>]`` is set: the process then kills itself
the ``n``-th time (default: the first) it reaches ``point``. With
``MODSTAGE_FAULT_TRACE=<file>`` every point reached is appended to ``file``, one per
line, so a test can prove its list of points is the list the code passes through.
Without either variable :func:`hit` is one environment lookup.

Points (see :data:`POINTS`) are named after what has just been made durable, or is
about to be: ``state.<phase>.renaming`` is the moment after the new ``state.json`` was
written to its temporary file and before the rename, ``state.<phase>.saved`` the
moment after.
"""

from __future__ import annotations

import os

FAULT_ENV = "MODSTAGE_FAULT"
TRACE_ENV = "MODSTAGE_FAULT_TRACE"

#: Every point, in the order a successful intake, then a boot, passes through them.
INTAKE_POINTS = (
    "intake.verifying",  # status says verifying; nothing else written
    "store.copied",  # copies sit in store/.tmp-*, not yet verified
    "store.publish.renaming",  # verified and read-only, not yet renamed to its id
    "store.published",  # store/<generation> exists, state does not know it
    "state.pending.renaming",
    "state.pending.saved",
    "store.collected",  # generations beyond ``retain`` removed
    "intake.recorded",  # status says pending; the drop is still in incoming/
    "drop.removing",  # the drop's manifest is gone, its files not yet
)
REJECT_POINTS = (
    "intake.rejected",  # status says rejected; the drop is still there
    "quarantine.moved",  # the drop is in quarantine/, its record not yet written
)
BOOT_POINTS = (  # the boot id is saved with the first attempt
    "state.loading.renaming",
    "state.loading.saved",  # attempt counted (and the boot id recorded), nothing loaded
    "boot.finit.before",
    "boot.finit.after",  # the module is in the kernel, state says loading
    "state.active.renaming",
    "state.active.saved",
)
BOOT_FAIL_POINTS = ("state.failed.renaming", "state.failed.saved")
#: A boot with nothing to load or expire saves the boot id alone.
IDLE_BOOT_POINTS = ("state.boot_id.renaming", "state.boot_id.saved")
POINTS = INTAKE_POINTS + REJECT_POINTS + BOOT_POINTS + BOOT_FAIL_POINTS + IDLE_BOOT_POINTS

_hits: dict[str, int] = {}


def hit(point: str) -> None:
    """Reach ``point``: record it when tracing, die here when told to."""
    trace = os.environ.get(TRACE_ENV)
    if trace:
        with open(trace, "a", encoding="utf-8") as f:
            f.write(point + "\n")
    spec = os.environ.get(FAULT_ENV)
    if not spec:
        return
    name, _, nth = spec.partition(":")
    if name != point:
        return
    _hits[point] = _hits.get(point, 0) + 1
    if _hits[point] >= int(nth or "1"):
        import signal  # only when a fault is armed: an enum-heavy import on the boot path

        os.kill(os.getpid(), signal.SIGKILL)

"""A bundle's phases and the table of which may follow which.

The vocabulary of :mod:`service.bundles.state`'s transitions: each named transition
moves a bundle through :func:`next_phase`, which refuses a move the table does not
allow.
"""

from __future__ import annotations

from enum import StrEnum

from service.errors import IllegalTransition


class Phase(StrEnum):
    """Where a bundle's newest generation stands."""

    NONE = "none"
    VERIFYING = "verifying"
    REJECTED = "rejected"
    PENDING = "pending"
    REBOOT_SCHEDULED = "reboot_scheduled"
    LOADING = "loading"
    ACTIVE = "active"
    FAILED = "failed"
    NO_DEVICE = "no_device"  # boot found none of the devices the bundle's modules are for
    # boot found no generation for the running kernel (the active one targets another):
    # nothing of the bundle is loaded
    OTHER_KERNEL = "other_kernel"


TRANSITIONS: dict[Phase, frozenset[Phase]] = {
    # intake records a verified generation as pending (a newer one replaces it)
    Phase.NONE: frozenset({Phase.PENDING}),
    # ... or an admin cancels it (rollback to the active generation): active again
    # (every phase a boot may find but loading: other_kernel when the running kernel is
    # not the one the bundle's generations target)
    Phase.PENDING: frozenset(
        {Phase.PENDING, Phase.REBOOT_SCHEDULED, Phase.LOADING, Phase.ACTIVE, Phase.OTHER_KERNEL}
    ),
    # the daemon recorded its intent to reboot; a newer drop makes it pending again
    Phase.REBOOT_SCHEDULED: frozenset({Phase.PENDING, Phase.LOADING, Phase.OTHER_KERNEL}),
    # boot: loading again after a crash mid-load, then active or failed
    Phase.LOADING: frozenset({Phase.LOADING, Phase.ACTIVE, Phase.FAILED, Phase.NO_DEVICE}),
    Phase.ACTIVE: frozenset({Phase.PENDING, Phase.LOADING, Phase.OTHER_KERNEL}),
    Phase.FAILED: frozenset({Phase.PENDING, Phase.LOADING, Phase.OTHER_KERNEL}),
    # the hardware was absent: the next boot tries the same generation again
    Phase.NO_DEVICE: frozenset({Phase.PENDING, Phase.LOADING, Phase.OTHER_KERNEL}),
    # a drop for the running kernel, the reboot into the pending generation's kernel asked,
    # or a boot into a kernel a generation targets
    Phase.OTHER_KERNEL: frozenset({Phase.PENDING, Phase.REBOOT_SCHEDULED, Phase.LOADING}),
    # status-file phases of an intake in progress or refused: never recorded in state.json
    Phase.VERIFYING: frozenset(),
    Phase.REJECTED: frozenset(),
}


def next_phase(current: Phase, target: Phase) -> Phase:
    """``target`` if the machine allows moving there from ``current``; raises otherwise."""
    if target not in TRANSITIONS[current]:
        raise IllegalTransition(f"-> {target.value}", current.value, "not in the phase table")
    return target

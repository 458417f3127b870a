"""A planned driver upgrade told from a failure: the bundle between its driver's unload
and the boot that loads its pending generation, and how long that may last.

Nothing here reads a file: :func:`upgrade_of` takes what :mod:`service.status.survey`
read (:class:`Unloads`) and the bundle's state.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from service.bundles.phase import Phase
from service.bundles.state import BundleState

#: how long after the driver pod's modules were unloaded its drop may take to arrive (the
#: new pod's image pulled and its container started) before the missing modules are a failure
DROP_GRACE = 15 * 60.0
#: the operator's readiness file: the driver pod's startup probe writes it, its preStop
#: removes it (so it is absent while a driver pod is being replaced)
DRIVER_POD_READY = "/run/nvidia/validations/.driver-ctr-ready"


@dataclass(frozen=True)
class Unloads:
    """What the host knows of modules leaving the kernel, for telling an upgrade from a
    failure: when each left in this boot (the daemon's record of the kernel's uevents),
    whether the operator's driver pod is ready (None: no operator on this host), the time
    now and the bound (seconds) past which an upgrade is a failure."""

    at: Mapping[str, float]
    pod_ready: bool | None
    now: float
    bound: float
    grace: float = DROP_GRACE


@dataclass(frozen=True)
class Upgrading:
    """A bundle between its driver's unload and the boot that loads its pending generation
    (or the drop that brings one, for :data:`DROP_GRACE`)."""

    to: str | None  # the pending generation (None: the new driver pod's drop is not in yet)
    version: str | None
    since: float  # counted from: the first unload the daemon saw, else the pending's record
    unload_seen: bool  # ``since`` is the unload itself
    limit: float  # seconds it may last (the bound, or the drop's grace) before it is failed
    now: float

    @property
    def seconds(self) -> float:
        """How long the bundle has been without its driver (at least)."""
        return max(0.0, self.now - self.since)

    @property
    def expired(self) -> bool:
        """It lasted past its limit: a failure."""
        return self.seconds > self.limit


def _went(bundle: BundleState, phase: Phase) -> float | None:
    """When the bundle last moved into ``phase`` (None: not in its history)."""
    return next((h.at for h in reversed(bundle.history) if h.target == phase.value), None)


def upgrade_of(bundle: BundleState, missing: list[str], unloads: Unloads) -> Upgrading | None:
    """Whether the active generation's missing modules left for a planned upgrade.

    Planned: a pending generation that has not failed was recorded after the active one
    went live (the driver pod's drop, or the same generation dropped again for a new
    digest), and the modules left the kernel by an unload (the daemon saw their ``remove``
    uevents) or, unseen, at least are missing while it waits. Also planned, for
    :data:`DROP_GRACE` after the daemon saw the unload: no pending generation yet while the
    operator's driver pod is being replaced (its readiness file is gone), the seconds
    between the new pod's init container and its drop. Anything else (an ``rmmod`` with
    nothing pending, a pending generation older than the live one) is None: a failure.
    """
    if not missing:
        return None
    seen = [unloads.at[m] for m in missing if m in unloads.at]
    unloaded = min(seen) if seen else None
    gen = bundle.generations.get(bundle.pending) if bundle.pending else None
    if gen is not None and not gen.failed:
        recorded, live = _went(bundle, Phase.PENDING), _went(bundle, Phase.ACTIVE)
        if recorded is None or (live is not None and recorded < live):
            return None
        since = unloaded if unloaded is not None else recorded
        return Upgrading(
            gen.id, gen.version, since, unloaded is not None, unloads.bound, unloads.now
        )
    if bundle.pending is None and unloaded is not None and unloads.pod_ready is False:
        return Upgrading(None, None, unloaded, True, unloads.grace, unloads.now)
    return None


def span(seconds: float) -> str:
    """A duration as people say it: ``45 s``, ``3 min 12 s``, ``4 h 5 min``,
    ``6 d 23 h 1 min``."""
    s = int(max(0, seconds))
    if s < 60:
        return f"{s} s"
    if s < 3600:
        return f"{s // 60} min {s % 60} s"
    if s < 86400:
        return f"{s // 3600} h {s % 3600 // 60} min"
    return f"{s // 86400} d {s % 86400 // 3600} h {s % 3600 // 60} min"


def upgrading_reason(up: Upgrading, missing: list[str]) -> str:
    """One line: what the bundle waits for, how long it has been without its driver, and
    when that becomes a failure (or that it has)."""
    modules = ", ".join(missing)
    how = "unloaded" if up.unload_seen else "not loaded"
    since = f"{span(up.seconds)}" if up.unload_seen else f"at least {span(up.seconds)}"
    if up.to is None:
        what = (
            f"module(s) {modules} were unloaded {span(up.seconds)} ago while the driver pod "
            "is replaced; its drop has not come in yet"
        )
        limit = f"failed if it has not come within {span(up.limit)}"
        if up.expired:
            return f"{what}, past the {span(up.limit)} it may take: the drop never came"
        return f"upgrading: {what} ({limit})"
    what = (
        f"module(s) {modules} {how} for pending generation {up.to[:12]} ({up.version}); "
        f"without its driver for {since}"
    )
    if up.expired:
        return (
            f"the upgrade to {up.version} has lasted past its bound of {span(up.limit)}: "
            f"{what}; the reboot that loads it has not come"
        )
    return f"upgrading: {what}; failed if the reboot has not come within {span(up.limit)}"

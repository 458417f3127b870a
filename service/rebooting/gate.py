"""The next kernel's reboot gate: a reboot into a kernel a bundle has no driver for waits.

The reboot a GPU node takes most often is a kernel update: the distribution installs kernel
Y, and its next boot runs Y. A bundle whose generations were all built for the running
kernel X has nothing a boot into Y would load, so that boot is driver-less until an image for
Y is staged, and then a second reboot follows. The gate holds every reboot (the host's own
reboot-required file as well as modstage's) while some bundle with a driver now has no
generation for the next boot's kernel, so the driver for Y can be staged first and one
reboot does both. Only a cover of ``ready`` releases a bundle; the gate's words say when
its drop for Y arrived and waits to be judged, was refused, or an admin holds what it has.

The hold is bounded: ``[kernel] hold_max`` seconds after kernel Y was installed (its image's
change time: dpkg writes the file when it unpacks the package) the gate opens and the
reboot goes through; the bundles it leaves behind are named in ``status``, in the metrics
and in kured's log. ``hold_max = 0`` never holds. A next kernel modstage cannot tell
(``status``'s ``next boot:`` line says why) holds nothing.

:func:`uncovered` and :meth:`Gate.holds` are pure; :func:`gate_for` reads the host.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime

from service.bundles.cover import next_kernel_cover
from service.bundles.state import State
from service.config import Config
from service.host.nextboot import next_kernel
from service.layout import Layout, kernel_image
from service.publish.arrivals import next_covers


def _iso(epoch: float) -> str:
    return datetime.fromtimestamp(epoch, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


@dataclass(frozen=True)
class Gate:
    """The next boot runs ``kernel``, another than the running one, and ``bundles`` (each
    with an active generation: a driver it has now) have no generation a boot into it
    would load. A reboot is held for them from ``since`` (when that kernel was installed)
    until ``until``; past it the reboot goes through and they boot without their driver."""

    kernel: str
    bundles: tuple[str, ...]
    since: float
    until: float
    now: float
    # each bundle's cover (:func:`~service.bundles.cover.next_kernel_cover`), by name
    covers: Mapping[str, str] = field(default_factory=dict)

    @property
    def holds(self) -> bool:
        """Whether a wanted reboot waits now (bundles uncovered, the bound not reached)."""
        return bool(self.bundles) and self.now < self.until

    @property
    def left(self) -> float:
        """Seconds until the hold ends by time alone (0: it has)."""
        return max(0.0, self.until - self.now)

    def line(self) -> str:
        """What the gate says, in the words plain status and kured's log both show."""
        names = ", ".join(self.bundles)
        whys = [w for b in self.bundles if (w := _why(b, self.covers.get(b), self.kernel))]
        why = "".join(f"{w}; " for w in whys)
        if self.holds:
            return (
                f"held: the next boot runs kernel {self.kernel} and {names} has no generation "
                f"for it ({why}a driver for {self.kernel} staged and accepted lifts the hold; "
                f"[kernel] hold_max ends it at {_iso(self.until)}, then {names} boots "
                "without its driver)"
            )
        return (
            f"the next boot runs kernel {self.kernel} and {names} has no generation for it: "
            f"it boots without its driver (held until {_iso(self.until)}, [kernel] hold_max)"
        )


def _why(bundle: str, cover: str | None, kernel: str) -> str | None:
    """What a held bundle's cover adds to the gate's words (None: nothing)."""
    return {
        "waiting": f"{bundle}'s drop for {kernel} arrived and waits to be judged",
        "refused": f"{bundle}'s newest drop for {kernel} was refused",
        "held": f"{bundle}'s generation for {kernel} is held by an admin",
    }.get(cover or "")


def uncovered(
    state: State, release: str, covers: Mapping[str, str] | None = None
) -> dict[str, str]:
    """The bundles that have an active generation and none a boot into kernel ``release``
    would load, with their cover (``covers``, else
    :func:`~service.bundles.cover.next_kernel_cover` from the state alone; only ``ready``
    releases); a bundle with nothing active has nothing to lose."""
    out = {}
    for name, b in sorted(state.bundles.items()):
        cover = (covers or {}).get(name) or next_kernel_cover(b, release)
        if b.active is not None and cover != "ready":
            out[name] = cover
    return out


def installed_at(layout: Layout, release: str, now: float) -> float:
    """When kernel ``release`` was installed: its image's change time (dpkg keeps the
    package's modification time and sets the change time when it unpacks the file); ``now``
    when the image cannot be read. A change time ahead of the clock is taken as it is, so
    the bound stays where it was set."""
    try:
        return kernel_image(layout, release).stat().st_ctime
    except OSError:
        return now


def gate_for(layout: Layout, config: Config, state: State, running: str, now: float) -> Gate | None:
    """The gate of the host under ``layout`` at ``now``: None when the next boot runs
    ``running`` again, when modstage cannot tell which kernel it runs, or when every bundle
    with a driver has a generation for it."""
    found = next_kernel(layout, config.kernel.next)
    if found.release is None or found.release == running:
        return None
    covers = next_covers(layout, config, state, found.release)
    bundles = uncovered(state, found.release, covers)
    if not bundles:
        return None
    since = installed_at(layout, found.release, now)
    until = since + config.kernel.hold_max
    return Gate(found.release, tuple(bundles), since, until, now, bundles)

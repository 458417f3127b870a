"""What a boot into a given kernel would bring up of a bundle, read from its records (no
I/O): the generation carried for a kernel, the one a boot into it loads, and the cover the
gate (:mod:`service.rebooting.gate`), the announcement
(:mod:`service.publish.announce`) and the node labels report for the next boot's kernel.

A bundle has one pending generation; a kernel update staged for the next kernel can lose
that slot to a later drop for the running kernel, and a boot back into an older kernel finds
the active generation built for the newer one. :func:`carried` is what such a boot loads
(:func:`service.boot.plan.choose`): the newest retained generation built for that kernel.
"""

from __future__ import annotations

from service.bundles.state import BundleState, Generation, added
from service.host.installed import compare_versions


def carried(bundle: BundleState, kernel: str, floor: str | None = None) -> Generation | None:
    """The generation a boot into ``kernel`` loads when neither the pending nor the active
    one is for it: the newest retained one built for ``kernel`` that did not fail, that no
    admin rolled back from and whose version does not order below ``floor`` (the bundle's
    ``[bundles] min_version`` now: a floor set after it was taken in keeps it from coming
    back by itself; an admin's rollback below the floor is the pending generation, not a
    carried one). None when there is none, and for a bundle with nothing active (it has no
    driver on this node to keep: a state rebuilt after corruption remembers the stored
    generations, and nothing is guessed from them)."""
    if bundle.active is None:
        return None
    own = (
        g
        for g in bundle.generations.values()
        if g.kernel == kernel and not g.failed and not g.rolled_back
        if g.id not in (bundle.active, bundle.pending)
        if floor is None or compare_versions(g.version, floor) >= 0
    )
    return max(own, key=added, default=None)


def would_load(
    bundle: BundleState,
    release: str,
    floor: str | None = None,
    max_attempts: int | None = None,
) -> Generation | None:
    """The generation a boot into kernel ``release`` would bring up (None: nothing): the
    pending one if it is for ``release``, not failed, not held by an admin and (given
    ``max_attempts``, the config's ``max_boot_attempts``) with a boot attempt left, else the
    active one if it is for ``release``, else the one :func:`carried` for it (not while
    held; ``floor`` as for :func:`carried`). The boot's own choice is
    :func:`service.boot.plan.choose`."""

    def usable(gen: str | None) -> Generation | None:
        g = bundle.generations.get(gen) if gen else None
        return g if g is not None and g.kernel == release and not g.failed else None

    pending = usable(bundle.pending)
    if pending is not None and max_attempts is not None and pending.attempts >= max_attempts:
        pending = None  # the boot expires it (plan.choose)
    if pending is not None and not bundle.held:
        return pending
    active = usable(bundle.active)
    if active is not None:
        return active
    return None if bundle.held else carried(bundle, release, floor)


#: the covers, by precedence: the first that holds is the one reported
COVERS = ("ready", "waiting", "refused", "held", "none")


def next_kernel_cover(
    bundle: BundleState,
    release: str,
    *,
    floor: str | None = None,
    arrived: bool = False,
    refused_at: float | None = None,
    max_attempts: int | None = None,
) -> str:
    """Whether a boot into kernel ``release`` would load ``bundle``, the first that holds:

    * ``ready``: :func:`would_load` names a generation (``floor``: the bundle's
      ``min_version``, as for :func:`carried`; ``max_attempts``: the config's
      ``max_boot_attempts``);
    * ``waiting``: ``arrived``, a drop of the bundle built for ``release`` sits in an
      incoming directory, not judged yet (being taken in, or waiting there: an admin's hold,
      the kernel's module tree not installed yet); its verdict comes after any refusal;
    * ``refused``: the newest drop for ``release`` was refused: ``refused_at``, when the
      newest refused drop for it was refused (its quarantine record,
      :func:`service.publish.quarantine.refused_at`), is later than every generation for
      ``release`` the bundle remembers was taken in; the driver pod that made it has to act,
      whatever an admin holds;
    * ``held``: only what an admin's hold keeps back is for it;
    * ``none``: nothing is.
    """
    if would_load(bundle, release, floor, max_attempts) is not None:
        return "ready"
    if arrived:
        return "waiting"
    if refused_at is not None and all(
        g.added < refused_at for g in bundle.generations.values() if g.kernel == release
    ):
        return "refused"
    gen = bundle.generations.get(bundle.pending) if bundle.pending else None
    usable = gen is not None and gen.kernel == release and not gen.failed
    usable = usable and (max_attempts is None or gen is None or gen.attempts < max_attempts)
    held = usable or (bundle.held and carried(bundle, release, floor))
    return "held" if held else "none"

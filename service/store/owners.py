"""Which bundle owns which module: one bundle per module name.

The kernel loads a module name once, so two bundles carrying the same module cannot both
come up: at boot the bundle loaded first takes the name and the other fails. A bundle owns
the modules of its active and pending generations (the generations a boot may load). Intake
refuses a drop carrying a module another bundle owns (:func:`service.store.admit.claimed_modules`),
and an admin's ``retry`` or ``rollback`` that would make a generation pending whose modules
another bundle owns now is refused the same way (:func:`verb_claims`): a generation that was
retained while it was neither active nor pending owns nothing, so another bundle may have
taken its modules since.
"""

from __future__ import annotations

from service.store.generations import Store
from service.store.state import State
from stager.errors import ManifestError


def module_owners(state: State, store: Store, bundle: str) -> dict[str, tuple[str, str]]:
    """Module name -> (bundle, generation) for the active and pending generations of the
    bundles other than ``bundle`` (a generation gone from the store owns nothing)."""
    owners: dict[str, tuple[str, str]] = {}
    for name, other in sorted(state.bundles.items()):
        for generation in sorted(other.keep()) if name != bundle else ():
            try:
                modules = store.manifest(generation).modules
            except (OSError, ManifestError):
                continue
            owners.update({m.name: (name, generation) for m in modules})
    return owners


def verb_claims(state: State, store: Store, bundle: str, generation: str) -> list[str]:
    """Why ``generation`` of ``bundle`` cannot be made pending: each of its modules another
    bundle owns now (an unreadable generation claims nothing here: the boot says why)."""
    try:
        modules = store.manifest(generation).modules
    except (OSError, ManifestError):
        return []
    owners = module_owners(state, store, bundle)
    problems = []
    for module in modules:
        owner = owners.get(module.name)
        if owner is None:
            continue
        other, theirs = owner
        problems.append(
            f"generation {generation[:12]} loads module {module.name!r}, which bundle "
            f"{other!r} owns now (generation {theirs[:12]}): the kernel loads a module once; "
            f"modstage forget {other} first if that bundle is the mistake"
        )
    return problems

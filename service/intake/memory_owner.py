"""Which bundle sets the host's memory onlining policy: one policy per host.

``auto_online_blocks`` and the zone a hot-added block is onlined into are host-wide, and a
bundle's manifest may ask for one policy (``[memory]``), which boot applies after the
bundle's modules load. Two bundles asking for different policies would leave the host with
whichever loaded last, so the bundle whose active or pending generation asks for a policy
owns it: intake refuses a drop of another bundle asking for a different one, naming the
owner (:func:`memory_claims`). A drop asking for the same policy, or none, is not refused.
"""

from __future__ import annotations

from service.bundles.state import State
from service.generations.store import Store
from stager.schema.failures import ManifestError
from stager.schema.manifest import Manifest


def memory_claims(manifest: Manifest, state: State, store: Store) -> list[str]:
    """Why ``manifest``'s memory policy cannot be taken: each other bundle whose active or
    pending generation asks for a different one (a generation gone from the store, or
    unreadable, asks for nothing)."""
    wanted = manifest.memory
    if wanted is None:
        return []
    problems = []
    for name, other in sorted(state.bundles.items()):
        for generation in sorted(other.keep()) if name != manifest.bundle else ():
            try:
                theirs = store.manifest(generation).memory
            except (OSError, ManifestError):
                continue
            if theirs is not None and theirs is not wanted:
                problems.append(
                    f"memory policy {wanted.value!r}: bundle {name!r} (generation "
                    f"{generation[:12]}) sets the host's policy to {theirs.value!r}, and a "
                    "host has one; modstage forget that bundle first if it is the mistake"
                )
    return problems

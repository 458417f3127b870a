"""What the host refuses in a drop by its bundle's ``[bundles.<name>]`` table (pure).

A trusted vendor key can sign any module under any name. ``modstage boot`` loads a
generation early in boot, before most in-tree modules: a drop's module named like one of
the target kernel's own (``nvme``, ``mlx5_core``, ``crc8``) takes that name, and the
kernel's module never loads (modprobe finds the name taken). So a drop module whose name
the target kernel's tree or ``modules.builtin`` has (:mod:`service.verify.target.intree`)
is refused unless ``shadow_in_tree`` allows that name; where ``modules`` names globs, a
module no glob matches is refused too. A module's name is the one the kernel registers
(``struct module``'s, from the verdict), else the file's; names compare ``-`` and ``_``
alike, as the kernel does.

Where ``params`` names globs, a module parameter of the drop no glob matches is refused
(beside the host's ``forbidden_params``, which no bundle may set).

A drop whose manifest version orders below ``min_version`` (Debian's order,
:func:`~service.kernel.installed.compare_versions`) is refused, unless it is the bundle's
active or pending generation already: an admin's rollback below the floor, which the
driver's pod then stages again, stands (``modstage rollback`` itself is not judged here).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Collection, Sequence

from service.bundlepolicy import BundlePolicy, name_matches
from service.kernel.installed import compare_versions
from stager.manifest import ModuleEntry
from stager.params import parse_params
from stager.paths import normalize_module_name


def name_problems(
    modules: Sequence[tuple[str, str]],
    *,
    bundle: str,
    policy: BundlePolicy,
    in_tree: Callable[[str], str | None],
    builtin: Collection[str],
) -> list[str]:
    """Each module of a drop whose name the bundle may not carry: one that would take the
    name of one of the target kernel's own modules (naming that module), or that no glob of
    ``modules`` matches when it has some; each problem names the file and the key.

    ``modules``: (file in the drop, the module's name) of each; ``in_tree``: the path (as
    the host names it) of the target's in-tree module of a name, or None; ``builtin``: the
    names of ``modules.builtin``.
    """
    problems = []
    for file, name in modules:
        name = normalize_module_name(name)
        if policy.modules and not name_matches(policy.modules, name):
            problems.append(
                f"{file}: module {name} matches none of [bundles.{bundle}] modules = "
                f"{json.dumps(list(policy.modules))}"
            )
        found = in_tree(name)
        if found is not None:
            theirs = f"in-tree module {found}"
        elif name in builtin:
            theirs = f"module {name}, built in (modules.builtin)"
        else:
            continue
        if name_matches(policy.shadow_in_tree, name):
            continue
        problems.append(
            f"{file}: module {name} would take the place of the target kernel's {theirs}; "
            f"[bundles.{bundle}] shadow_in_tree does not name it"
        )
    return problems


def below_floor(version: str, bundle: str, policy: BundlePolicy) -> str | None:
    """Why ``version`` is below the bundle's ``min_version``, naming both, or None."""
    floor = policy.min_version
    if floor is None or compare_versions(version, floor) >= 0:
        return None
    return (
        f"version {version} orders below [bundles.{bundle}] min_version = "
        f"{json.dumps(floor)} (Debian's version order)"
    )


def unlisted_params(modules: Sequence[ModuleEntry], bundle: str, policy: BundlePolicy) -> list[str]:
    """Each parameter a drop's modules set that no glob of the bundle's ``params`` matches,
    naming the module's file, the parameter and the globs (none when ``params`` is empty)."""
    if not policy.params:
        return []
    globs = json.dumps(list(policy.params))
    return [
        f"{module.file}: parameter {name} matches none of [bundles.{bundle}] params = {globs}"
        for module in modules
        for name, _value in parse_params(module.params)
        if not name_matches(policy.params, name)
    ]

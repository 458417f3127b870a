"""Rules over a bundle's modules as a whole, judged on their verdicts (ELF names, depends=).

The loader loads a bundle's modules in manifest order with ``finit_module``, which does not
resolve dependencies: a module whose ``depends=`` names a module of the same bundle that
comes later would fail at boot (``ENOENT``, unresolved symbols). modstage never reorders
(the manifest's order is the container's decision, and parameters may rely on it); it
refuses such a bundle at intake instead. Members are matched by the name the kernel
registers (the ELF's ``struct module`` name), not by file name: ``nvidia-580.ko`` may
well be module ``nvidia``.
"""

from __future__ import annotations

from collections.abc import Sequence

from service.verify.verdict import Verdict
from stager.paths import normalize_module_name


def order_problems(verdicts: Sequence[Verdict]) -> list[str]:
    """Reasons why loading ``verdicts``' modules in this order must fail; empty if none."""
    problems = []
    position = {
        normalize_module_name(v.name): i for i, v in reversed(list(enumerate(verdicts))) if v.name
    }
    seen: dict[str, str] = {}
    for i, v in enumerate(verdicts):
        if not v.name:
            continue
        name = normalize_module_name(v.name)
        if name in seen:
            problems.append(
                f"{v.file}: EEXIST: module {name} is also {seen[name]}, earlier in the bundle"
            )
        seen.setdefault(name, v.file)
        for dep in map(normalize_module_name, v.depends):
            if position.get(dep, -1) > i:
                later = verdicts[position[dep]].file
                problems.append(
                    f"{v.file}: ENOENT: depends on {dep} ({later}), which the bundle loads "
                    "later; modules load in manifest order, put it first"
                )
    return problems

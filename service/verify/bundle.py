"""Rules over a bundle's modules as a whole, judged on their verdicts (ELF names, depends=).

The loader loads a bundle's modules in manifest order with ``finit_module``, which does not
resolve dependencies: a module whose ``depends=`` names a module of the same bundle that
comes later would fail at boot (``ENOENT``, unresolved symbols). modstage never reorders
(the manifest's order is the container's decision, and parameters may rely on it); it
refuses such a bundle at intake instead. Members are matched by the name the kernel
registers (the ELF's ``struct module`` name), not by file name: ``nvidia-580.ko`` may
well be module ``nvidia``.

``modstage verify`` judges its arguments the same way (:func:`verify_paths`): the module
files named outside drops are one bundle in the order given, each drop is its own.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from functools import partial
from pathlib import Path

from service.errors import Refusal
from service.verify.compressed.budget import run_all
from service.verify.signature.trust import TrustStore
from service.verify.targetkernel.kernel import Target
from service.verify.verdict import Verdict, verify_drop, verify_modules, verify_path
from stager.schema.paths import normalize_module_name


def order_refusals(verdicts: Sequence[Verdict]) -> list[tuple[int, Refusal]]:
    """Why loading ``verdicts``' modules in this order must fail, by the index of the
    module that fails; empty if none."""
    refusals = []
    position = {
        normalize_module_name(v.name): i for i, v in reversed(list(enumerate(verdicts))) if v.name
    }
    seen: dict[str, str] = {}
    for i, v in enumerate(verdicts):
        if not v.name:
            continue
        name = normalize_module_name(v.name)
        if name in seen:
            why = f"module {name} is also {seen[name]}, earlier in the bundle"
            refusals.append((i, Refusal("EEXIST", why)))
        seen.setdefault(name, v.file)
        for dep in map(normalize_module_name, v.depends):
            if position.get(dep, -1) > i:
                later = verdicts[position[dep]].file
                why = (
                    f"depends on {dep} ({later}), which the bundle loads later; "
                    "modules load in manifest order, put it first"
                )
                refusals.append((i, Refusal("ENOENT", why)))
    return refusals


def order_problems(verdicts: Sequence[Verdict]) -> list[str]:
    """Reasons why loading ``verdicts``' modules in this order must fail; empty if none."""
    return [f"{verdicts[i].file}: {why}" for i, why in order_refusals(verdicts)]


def in_order(verdicts: Sequence[Verdict]) -> list[Verdict]:
    """``verdicts`` with each module's first order refusal as its reason, unless a check
    the kernel makes before it refuses the module (``EEXIST`` and symbol resolution come
    after the signature, ELF, vermagic checks): it replaces no reason, a policy's, or the
    ``ENOENT`` of an unknown symbol (the one a dependency loaded later causes)."""
    out = list(verdicts)
    for i, why in reversed(order_refusals(verdicts)):  # reversed: the first one stays
        was = verdicts[i].refusal
        if was is None or was.policy or was.errno == "ENOENT":
            out[i] = replace(verdicts[i], ok=False, refusal=why)
    return out


def verify_paths(
    paths: list[Path], *, trust: TrustStore, kernel: str | Target, apart: bool = False
) -> list[Verdict]:
    """Verdicts for module files and drop directories, in argument order.

    Judged as intake judges drops: the files as one bundle loaded in the order given,
    wherever drops sit between them (two or more say so in a note); each drop as its own
    bundle, in its manifest's order. Every bundle loads after no other (``after = []``):
    none sees another's exports. ``apart``: every file is judged alone instead (as if
    loaded on a kernel where none of the others is).
    """
    drops = [p.is_dir() for p in paths]
    files = [p for p, drop in zip(paths, drops, strict=True) if not drop]
    if apart:
        named = run_all([partial(verify_path, p, trust=trust, kernel=kernel) for p in files])
    elif files:
        named = in_order(verify_modules(files, trust=trust, kernel=kernel))
    else:
        named = []
    if len(files) > 1 and not apart:
        note = "judged as one bundle in the order given: " + ", ".join(map(str, files))
        named = [replace(v, notes=(*v.notes, note)) for v in named]
    loose = iter(named)
    out: list[Verdict] = []
    for p, drop in zip(paths, drops, strict=True):
        out += in_order(verify_drop(p, trust=trust, kernel=kernel)) if drop else [next(loose)]
    return out

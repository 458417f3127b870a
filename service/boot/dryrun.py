"""``modstage boot --dry-run``: what the next ``modstage boot`` would do, touching nothing.

The same decisions as the loader (:func:`~service.boot.plan.choose`,
:func:`~service.boot.plan.order`) on the state as it is, read without taking the
lock, counting an attempt or writing a file. Each module is re-verified read-only,
so the plan also says whether the kernel would accept it.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import TextIO

from service.boot.plan import Choice, choose, order
from service.config import Config
from service.errors import StateError
from service.kernel.firmware import PATH_PARAM
from service.layout import Layout
from service.store.generations import Store
from service.store.state import State
from service.store.statefile import read
from service.verify.target import Target
from service.verify.trust import TrustStore
from service.verify.verdict import verify_module
from stager.errors import ManifestError
from stager.manifest import Manifest
from stager.paths import normalize_module_name


@dataclass(frozen=True)
class PlannedModule:
    """One ``finit_module`` the boot would make, in order."""

    file: str
    params: str
    modprobe_first: tuple[str, ...]  # in-tree dependencies loaded with modprobe before it
    verdict: str  # "ok" or the reason the kernel would refuse it


@dataclass(frozen=True)
class PlannedBundle:
    """What one bundle would bring up."""

    choice: Choice
    version: str | None = None
    memory: str | None = None  # auto_online_blocks policy written before the first load
    firmware: tuple[str, ...] = ()  # files linked into the firmware view
    modules: tuple[PlannedModule, ...] = ()
    problem: str | None = None  # the generation cannot be read: the boot would fail it


def _modules(
    store: Store, generation: str, manifest: Manifest, trust: TrustStore, kernel: str | Target
) -> list[PlannedModule]:
    ours = {normalize_module_name(m.name) for m in manifest.modules}
    planned = []
    for module in manifest.modules:
        with open(store.path(generation) / module.file, "rb") as f:
            v = verify_module(f, display=module.file, trust=trust, kernel=kernel)
        verdict = "ok" if v.ok and v.sha256 == module.sha256 else v.reason or "digest changed"
        deps = tuple(d for d in map(normalize_module_name, v.depends) if d and d not in ours)
        planned.append(PlannedModule(module.file, module.params, deps, verdict))
    return planned


def plan_bundle(
    store: Store, choice: Choice, trust: TrustStore, kernel: str | Target
) -> PlannedBundle:
    """The plan for one bundle's choice (reads the store, changes nothing)."""
    if choice.generation is None:
        return PlannedBundle(choice)
    try:
        manifest = store.manifest(choice.generation)
        modules = tuple(_modules(store, choice.generation, manifest, trust, kernel))
    except (OSError, ManifestError) as exc:
        return PlannedBundle(choice, problem=f"cannot read the generation: {exc}")
    return PlannedBundle(
        choice,
        version=manifest.version,
        memory=manifest.memory.value if manifest.memory else None,
        firmware=tuple(f.file for f in manifest.firmware),
        modules=modules,
    )


def plan_boot(layout: Layout, config: Config, trust: TrustStore) -> list[PlannedBundle]:
    """Every bundle's plan, in load order."""
    try:
        state: State = read(layout.state)
    except OSError as exc:
        raise StateError(f"{layout.state}: cannot read: {exc.strerror or exc}") from exc
    kernel = layout.kernel_release()
    store = Store(layout.store)
    choices = [choose(n, b, kernel, config.max_boot_attempts) for n, b in state.bundles.items()]
    target = replace(Target.from_layout(layout, kernel), strict_crcs=False)  # as boot judges
    plans = {c.bundle: plan_bundle(store, c, trust, target) for c in choices}
    after: dict[str, tuple[str, ...]] = {}
    for c in choices:
        if c.generation is not None and plans[c.bundle].problem is None:
            after[c.bundle] = store.manifest(c.generation).after
    return [plans[c.bundle] for c in order(choices, after)]


def render(plans: list[PlannedBundle], layout: Layout, out: TextIO) -> None:
    """The plan as an admin reads it."""
    release = layout.kernel_release()
    print(f"dry run: nothing is loaded, written or rebooted (kernel {release})", file=out)
    if not plans:
        print("no bundles", file=out)
    for n, p in enumerate(plans, 1):
        c = p.choice
        if c.expired:
            print(
                f"{n}. {c.bundle}: would mark the pending generation failed: {c.expired}", file=out
            )
        if c.generation is None:
            print(f"{n}. {c.bundle}: nothing to load{f' ({c.note})' if c.note else ''}", file=out)
            continue
        role = "pending" if c.pending else "active"
        print(f"{n}. {c.bundle}: {role} generation {c.generation[:12]} ({p.version})", file=out)
        if p.problem:
            print(f"   would fail: {p.problem}", file=out)
            continue
        if c.fallback:
            print(f"   on failure: back to {c.fallback[:12]}", file=out)
        print(f"   memory: auto_online_blocks = {p.memory or '(left as it is)'}", file=out)
        if p.firmware:
            view = layout.run / "firmware"
            print(f"   firmware: {len(p.firmware)} files; {PATH_PARAM} = {view}", file=out)
            for f in p.firmware:
                print(f"     {f}", file=out)
        for i, m in enumerate(p.modules, 1):
            first = f" after modprobe {' '.join(m.modprobe_first)}" if m.modprobe_first else ""
            params = f" {m.params}" if m.params else ""
            print(f"   {i}) finit_module {m.file}{params}{first}: {m.verdict}", file=out)

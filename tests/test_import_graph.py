"""The import graph of ``service`` and ``stager`` runs one way, and its contracts stay.

The graph is grimp's (import-linter's), which reads every import statement, those inside
functions and under ``TYPE_CHECKING`` too: a cycle cannot hide behind a function-local
import. A function-local import may still keep a costly library off ``modstage boot``'s
path (``tests/service/test_boot_imports.py`` polices that cost); it may not close a loop.
"""

from __future__ import annotations

import tomllib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grimp
import pytest

from service.parser import VERBS

PYPROJECT = Path(__file__).resolve().parents[1] / "pyproject.toml"

#: The verification packages, each held to its own layers by a contract in pyproject.toml.
VERIFY_PACKAGES = (
    "service.verify.signature",
    "service.verify.targetkernel",
    "service.verify.modfile",
    "service.verify.compressed",
)


@pytest.fixture(scope="module")
def graph() -> grimp.ImportGraph:
    """The import graph of both packages, function-local imports included (no cache)."""
    return grimp.build_graph("service", "stager", cache_dir=None)


def cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module, each sorted.

    Tarjan's algorithm, iterative (no recursion limit on a deep chain). ``edges`` maps a
    module to the modules it imports; a module that imports itself is not a cycle here.
    """
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    for root in sorted(edges):
        if root in index:
            continue
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        work: list[tuple[str, Iterator[str]]] = [(root, iter(sorted(edges[root])))]
        while work:
            node, targets = work[-1]
            target = next(targets, None)
            if target is None:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[node])
                if low[node] == index[node]:
                    component = []
                    while True:
                        member = stack.pop()
                        on_stack.discard(member)
                        component.append(member)
                        if member == node:
                            break
                    if len(component) > 1:
                        found.append(sorted(component))
            elif target not in index:
                index[target] = low[target] = len(index)
                stack.append(target)
                on_stack.add(target)
                work.append((target, iter(sorted(edges.get(target, ())))))
            elif target in on_stack:
                low[node] = min(low[node], index[target])
    return sorted(found)


def describe(graph: grimp.ImportGraph, component: list[str]) -> str:
    """A cycle's modules and, for each import between two of them, where it is written."""
    members = set(component)
    lines = [" <-> ".join(component)]
    for importer in component:
        for imported in sorted(graph.find_modules_directly_imported_by(importer) & members):
            for detail in graph.get_import_details(importer=importer, imported=imported):
                lines.append(
                    f"    {importer}:{detail['line_number']} imports {imported}: "
                    f"{detail['line_contents']}"
                )
    return "\n".join(lines)


def test_cycles_finds_each_loop_and_nothing_else() -> None:
    """The cycle finder names each loop once, whole, and ignores chains and self-imports."""
    edges = {
        "a": {"b"},
        "b": {"c"},
        "c": {"a", "d"},
        "d": {"d", "e"},
        "e": set(),
        "f": {"g"},
        "g": {"f"},
    }
    assert cycles(edges) == [["a", "b", "c"], ["f", "g"]]
    assert cycles({"a": {"b"}, "b": {"c"}, "c": set()}) == []


def test_no_import_cycle_among_modules(graph: grimp.ImportGraph) -> None:
    """No module of ``service`` or ``stager`` reaches itself through its imports, counting
    the imports inside functions: each pair of modules has a direction."""
    edges = {module: graph.find_modules_directly_imported_by(module) for module in graph.modules}
    found = cycles(edges)
    report = "\n".join(describe(graph, component) for component in found)
    assert not found, f"import cycles (strongly connected components): {len(found)}\n{report}"


def contracts() -> list[dict[str, Any]]:
    """The import-linter contracts of pyproject.toml."""
    with open(PYPROJECT, "rb") as f:
        config = tomllib.load(f)
    found: list[dict[str, Any]] = config["tool"]["importlinter"]["contracts"]
    return found


@pytest.mark.parametrize("package", VERIFY_PACKAGES)
def test_each_verification_package_keeps_its_layers_contract(
    graph: grimp.ImportGraph, package: str
) -> None:
    """pyproject.toml keeps a layers contract whose container is ``package``, with layers,
    and the package exists: the verify layout cannot lose its guard unnoticed."""
    assert package in graph.modules, f"{package} is not a module of service"
    naming = [
        c
        for c in contracts()
        if c.get("type") == "layers" and package in c.get("containers", ()) and c.get("layers")
    ]
    assert naming, f"{PYPROJECT}: no [[tool.importlinter.contracts]] of layers names {package}"


def test_every_package_of_more_than_one_module_keeps_a_layers_contract(
    graph: grimp.ImportGraph,
) -> None:
    """Every package of ``service`` and ``stager`` with two modules or more is the container
    of a layers contract in pyproject.toml (the top-level packages by the service layers'
    contract and the container side's): a package added without its layers is found."""
    packages = {
        m
        for m in graph.modules
        if len([c for c in graph.find_children(m) if not c.endswith(".__init__")]) >= 2
    }
    guarded = {p for c in contracts() if c.get("type") == "layers" for p in c.get("containers", ())}
    guarded |= {"service"}  # its modules and packages are the service layers' contract
    assert not sorted(packages - guarded), (
        f"no layers contract in {PYPROJECT}: {sorted(packages - guarded)}"
    )


def test_the_import_graph_shows_the_module_that_runs_each_command() -> None:
    """Each command's row imports the module that runs it as a plain import statement (run
    only when the command runs), so the import graph ``lint-imports`` checks has an edge
    from ``service.parser`` to every command's module."""
    graph = grimp.build_graph("service", "stager")
    runners = {n: v.load().__module__ for n, v in VERBS.items() if v.load is not None}
    assert runners["boot"] == "service.cmd.boot" and runners["stage"] == "stager.drop"
    assert len(runners) == len(VERBS) - 1  # config alone is a group, not a command
    for name, module in runners.items():
        assert graph.direct_import_exists(importer="service.parser", imported=module), name

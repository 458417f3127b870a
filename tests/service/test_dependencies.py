"""The product imports only what pyproject.toml declares for it, and what it is specified with.

Every top-level package a module under ``stager/`` imports is the standard library's, the
project's own, or a distribution in ``[project] dependencies`` (the container side installs
nothing else) or the optional ``zstd`` extra (stage checks a ``.ko.zst`` payload with it when
installed, and accepts it by its magic without: ``tests/stager/test_stage_payload.py``); under ``service/`` it may also be one of the ``host`` extra, or of the
``tables`` extra (rich, for status's tables: optional, so its import must be guarded, which
``tests/service/test_status.py`` checks by rendering with rich not importable). A library the
tests alone use (asn1crypto builds their deliberately odd CMS blobs) stays out of the product.
"""

from __future__ import annotations

import ast
import importlib.metadata
import re
import sys
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
OWN = {"service", "stager"}


def normalized(name: str) -> str:
    """A distribution name as PEP 503 compares them."""
    return re.sub(r"[-_.]+", "-", name).lower()


def declared(*extras: str) -> set[str]:
    """Distribution names in ``[project] dependencies`` and in each of ``extras``."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    requirements = list(project["dependencies"])
    for extra in extras:
        requirements += project["optional-dependencies"][extra]
    return {normalized(re.split(r"[\s<>=!~;\[]", r, maxsplit=1)[0]) for r in requirements}


def imported(package: str) -> dict[str, set[str]]:
    """Top-level names outside the standard library and the project that modules under
    ``package`` import (anywhere in the module, deferred imports too), with the files."""
    found: dict[str, set[str]] = {}
    for path in sorted((ROOT / package).rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names = [node.module]
            else:
                continue
            for name in names:
                top = name.split(".")[0]
                if top not in sys.stdlib_module_names and top not in OWN:
                    found.setdefault(top, set()).add(str(path.relative_to(ROOT)))
    return found


@pytest.mark.parametrize(
    ("package", "extras"), [("stager", ("zstd",)), ("service", ("host", "tables"))]
)
def test_every_third_party_import_is_declared(package: str, extras: tuple[str, ...]) -> None:
    """Each third-party package the product imports comes from a declared distribution."""
    distributions = importlib.metadata.packages_distributions()
    allowed = declared(*extras)
    undeclared = {
        name: sorted(files)
        for name, files in imported(package).items()
        if not {normalized(d) for d in distributions.get(name, [name])} & allowed
    }
    assert not undeclared, f"imported but not declared for {package}: {undeclared}"


def test_asn1crypto_is_a_test_dependency_only() -> None:
    """asn1crypto is declared for the tests and imported by no product module."""
    assert "asn1crypto" in declared("test") - declared("host")
    assert "asn1crypto" not in imported("service") | imported("stager")


#: The libraries the project is specified with: distribution -> (the module the product
#: imports, the package that imports it, the extras that declare it beside the base).
SPECIFIED = {
    "tomli-w": ("tomli_w", "stager", ()),
    "structlog": ("structlog", "service", ("host",)),
    "pyudev": ("pyudev", "service", ("host",)),
    "watchdog": ("watchdog", "service", ("host",)),
}


@pytest.mark.parametrize("dist", sorted(SPECIFIED))
def test_each_specified_library_is_a_runtime_dependency_the_product_imports(dist: str) -> None:
    """pyudev, watchdog, tomli-w and structlog are each declared for the side that runs them
    (not only for the tests) and imported by a module of that side: dropping one from the
    code, or from pyproject, fails here."""
    module, package, extras = SPECIFIED[dist]
    assert normalized(dist) in declared(*extras), f"{dist} is not a runtime dependency"
    assert module in imported(package), f"no module under {package}/ imports {module}"


def test_status_on_a_terminal_without_rich_prints_the_plain_lines(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """rich is optional (the ``tables`` extra): on a terminal without it ``status`` prints
    the same plain lines it prints off a terminal, no error."""
    import io

    from service.bundles.state import State
    from service.status.collect import collect
    from service.status.view import lines, render
    from tests.service.test_status import failed_new, host

    class Terminal(io.StringIO):
        def isatty(self) -> bool:
            return True

    doc = collect(host(tmp_path, State({"nvidia": failed_new(fallback=True)})))
    monkeypatch.setitem(sys.modules, "rich", None)
    for name in [m for m in sys.modules if m.startswith("rich.")]:
        monkeypatch.delitem(sys.modules, name)
    out = Terminal()
    render(doc, out)
    assert out.getvalue() == "\n".join(lines(doc)) + "\n"

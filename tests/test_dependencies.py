"""The runtime dependencies pyproject.toml names are the ones the product imports.

The project is specified with pyudev, watchdog, tomli-w and structlog: each is named in
pyproject's runtime dependencies (tomli-w for both sides, the others for the host) and
imported by ``service`` or ``stager`` itself, in every statement grimp reads (functions
included), so dropping one from the code (or from pyproject) fails here.
"""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

import grimp
import pytest

PYPROJECT = Path(__file__).resolve().parents[1] / "pyproject.toml"

#: Distribution name -> the module the product imports, and which side needs it.
SPECIFIED = {
    "tomli-w": ("tomli_w", "dependencies"),
    "watchdog": ("watchdog", "host"),
    "structlog": ("structlog", "host"),
    "pyudev": ("pyudev", "host"),
}


def _names(requirements: list[str]) -> set[str]:
    """The distribution names of PEP 508 requirement strings, lower-case."""
    return {re.split(r"[<>=!~;\[ ]", r, maxsplit=1)[0].strip().lower() for r in requirements}


@pytest.fixture(scope="module")
def graph() -> grimp.ImportGraph:
    """The product's import graph with the external packages it imports (no cache)."""
    return grimp.build_graph("service", "stager", include_external_packages=True, cache_dir=None)


@pytest.mark.parametrize("dist", sorted(SPECIFIED))
def test_each_specified_library_is_a_runtime_dependency_and_imported(
    dist: str, graph: grimp.ImportGraph
) -> None:
    """pyproject names the library where its side needs it (not only for tests), and some
    module of service or stager imports it."""
    project = tomllib.loads(PYPROJECT.read_text())["project"]
    module, side = SPECIFIED[dist]
    declared = (
        project["dependencies"]
        if side == "dependencies"
        else project["optional-dependencies"][side]
    )
    assert dist in _names(declared), f"{dist} is not in [project] {side}"
    importers = graph.find_modules_that_directly_import(module)
    assert {m for m in importers if m.split(".")[0] in ("service", "stager")}, (
        f"no module of the product imports {module}"
    )

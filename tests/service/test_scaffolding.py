"""The service tests' scaffolding is written once: no fixture body is repeated across modules.

A fixture two modules need is one fixture in ``conftest.py`` (a factory where they differ,
like ``host_tree``); a module that needs another one defines it from that factory.
"""

from __future__ import annotations

import ast
import copy
from pathlib import Path

HERE = Path(__file__).parent


def _is_fixture(decorator: ast.expr) -> bool:
    """``pytest.fixture``, ``fixture``, either called with arguments or not."""
    target = decorator.func if isinstance(decorator, ast.Call) else decorator
    if isinstance(target, ast.Attribute):
        return target.attr == "fixture" and ast.unparse(target.value) == "pytest"
    return isinstance(target, ast.Name) and target.id == "fixture"


def _normalised(function: ast.FunctionDef | ast.AsyncFunctionDef) -> str:
    """The function as ``ast.dump`` shows it without its name, docstring and decorators."""
    body = function.body
    first = body[0] if body else None
    if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant):
        body = body[1:] if isinstance(first.value.value, str) else body
    bare = copy.copy(function)
    bare.name, bare.body, bare.decorator_list = "", body, []
    return ast.dump(bare)


def fixture_bodies(source: str) -> dict[str, str]:
    """Each module-level or nested fixture of ``source``: its name to its normalised body."""
    return {
        node.name: _normalised(node)
        for node in ast.walk(ast.parse(source))
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef)
        and any(_is_fixture(d) for d in node.decorator_list)
    }


def repeated_fixtures(modules: dict[str, str]) -> list[str]:
    """Every pair of fixtures in two different modules (path to source) with the same body."""
    first: dict[str, str] = {}
    found = []
    for path, source in sorted(modules.items()):
        for name, body in fixture_bodies(source).items():
            where = f"{path}::{name}"
            if body not in first:
                first[body] = where
            elif first[body].split("::")[0] != path:
                found.append(f"{first[body]} and {where} have the same body")
    return found


def test_no_fixture_body_is_repeated_across_service_test_modules() -> None:
    """No two modules under tests/service define a fixture with the same body (its name,
    docstring and decorators aside): shared scaffolding lives once, in conftest.py."""
    modules = {str(p.relative_to(HERE.parent.parent)): p.read_text() for p in HERE.rglob("*.py")}
    assert "tests/service/conftest.py" in modules
    assert repeated_fixtures(modules) == []


def test_the_check_sees_every_form_of_fixture_and_ignores_names_and_docstrings() -> None:
    """The same body under other names, docstrings and decorator spellings is found and both
    modules are named; the same body twice in one module, or a different body, is not."""
    a = '''
import pytest

@pytest.fixture
def host(tmp_path):
    """One."""
    return tmp_path / "root"
'''
    b = """
from pytest import fixture

@fixture(scope="session")
def other(tmp_path):
    return tmp_path / "root"

@fixture
def differs(tmp_path):
    return tmp_path / "other"
"""
    c = '''
import pytest

@pytest.fixture()
async def third(tmp_path):
    """Three."""
    return tmp_path / "root"
'''
    assert repeated_fixtures({"a.py": a, "b.py": b}) == [
        "a.py::host and b.py::other have the same body"
    ]
    assert repeated_fixtures({"a.py": a, "c.py": c}) == []  # async: another function
    assert repeated_fixtures({"a.py": a + a.replace("def host", "def again")}) == []
    assert fixture_bodies(a + "\ndef plain(tmp_path):\n    return tmp_path\n").keys() == {"host"}

"""The documents name what exists: paths, modules, cited files, and a map of every module.

The cheap claims of the prose are checked here, so that a rename or a removal that leaves a
document behind fails the suite, naming the file, the line and the name: the repository
paths a document mentions, the ``service.…``/``stager.…`` names a document, docstring or
comment mentions, the ``*.md`` files a document or comment cites, and the one-page map in
``docs/architecture.md``.
"""

from __future__ import annotations

import ast
import dataclasses
import importlib
import io
import re
import tokenize
from collections.abc import Iterator
from pathlib import Path
from typing import NamedTuple

import pytest

ROOT = Path(__file__).resolve().parents[1]
#: The documents, each read whole.
DOCS = sorted(
    [
        ROOT / "README.md",
        *(ROOT / "docs").glob("*.md"),
        ROOT / "deploy" / "README.md",
        ROOT / "tests" / "vm" / "README.md",
        ROOT / "tests" / "nvidia" / "README.md",
    ]
)
#: The trees whose docstrings and comments may name modules.
CODE = ("service", "stager", "tests", "bench", ".ci")
#: The trees whose comments may cite documents (shell, YAML, Containerfile comments too).
COMMENTED = (*CODE, "deploy")
SKIPPED = {"__pycache__", "kmod", "src"}  # bytecode, and kernel-module C sources
PATH = re.compile(r"(?<![\w./~$-])(?:service|stager|tests|bench|deploy|docs|\.ci)/[\w./*-]*")
DOTTED = re.compile(r"(?<![\w./~$-])(?:service|stager)(?:\.[A-Za-z_]\w*)+")
CITED = re.compile(r"(?<![\w./~$-])[\w./-]*\w\.md\b")


class Mention(NamedTuple):
    """A name found in a file, at a line."""

    file: Path
    line: int
    name: str

    def __str__(self) -> str:
        shown = self.file.relative_to(ROOT) if self.file.is_relative_to(ROOT) else self.file
        return f"{shown}:{self.line}: {self.name}"


def doc_lines(path: Path) -> Iterator[tuple[int, str]]:
    """Every line of a document, numbered from 1."""
    yield from enumerate(path.read_text(encoding="utf-8").splitlines(), 1)


def is_python(path: Path) -> bool:
    """A ``.py`` file, or a script whose first line runs Python (``bench/*``)."""
    if path.suffix == ".py":
        return True
    with path.open("rb") as f:
        first = f.readline()
    return first.startswith(b"#!") and b"python" in first


def python_prose(path: Path) -> Iterator[tuple[int, str]]:
    """The comments and docstrings of a Python file, line by line."""
    source = path.read_text(encoding="utf-8")
    for tok in tokenize.generate_tokens(io.StringIO(source).readline):
        if tok.type == tokenize.COMMENT:
            yield tok.start[0], tok.string
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef):
            first = node.body[0] if node.body else None
            if (
                isinstance(first, ast.Expr)
                and isinstance(first.value, ast.Constant)
                and isinstance(first.value.value, str)
            ):
                for i, line in enumerate(first.value.value.splitlines()):
                    yield first.lineno + i, line


def text_comments(path: Path) -> Iterator[tuple[int, str]]:
    """The ``#`` comments of a shell script, a unit, YAML or a Containerfile."""
    for n, line in doc_lines(path):
        if "#" in line:
            yield n, line[line.index("#") :]


def files(*trees: str) -> Iterator[Path]:
    """Every text file under ``trees`` (bytecode, data and kernel C sources left out)."""
    for tree in trees:
        for path in sorted((ROOT / tree).rglob("*")):
            if (
                path.is_file()
                and not SKIPPED & set(path.relative_to(ROOT).parts)
                and path.suffix not in {".json", ".pyc", ".c", ".h", ".ko", ".der", ".pem"}
            ):
                try:
                    path.read_text(encoding="utf-8")
                except UnicodeDecodeError:
                    continue
                yield path


def prose(path: Path) -> Iterator[tuple[int, str]]:
    """What a file says in words: a document whole, a program's comments and docstrings."""
    if path.suffix == ".md":
        return doc_lines(path)
    if is_python(path):
        return python_prose(path)
    return text_comments(path)


def mentions(pattern: re.Pattern[str], sources: list[Path]) -> list[Mention]:
    """Every match of ``pattern`` in what ``sources`` say in words."""
    return [
        Mention(path, n, m.group(0).rstrip(".-"))
        for path in sources
        for n, line in prose(path)
        for m in pattern.finditer(line)
    ]


def resolves(dotted: str) -> bool:
    """``dotted`` is a module, or a module's attribute (a class's field counts)."""
    parts = dotted.split(".")
    for cut in range(len(parts), 0, -1):
        try:
            obj: object = importlib.import_module(".".join(parts[:cut]))
        except ModuleNotFoundError:
            continue
        for name in parts[cut:]:
            if hasattr(obj, name):
                obj = getattr(obj, name)
            elif isinstance(obj, type) and name in _fields(obj):
                obj = None
            else:
                return False
        return True
    return False


def _fields(cls: type) -> set[str]:
    """The instance fields a class declares (dataclass and NamedTuple fields, annotations)."""
    names = {f.name for f in dataclasses.fields(cls)} if dataclasses.is_dataclass(cls) else set()
    for klass in cls.__mro__:
        names |= set(getattr(klass, "__annotations__", {}))
    return names


def path_exists(name: str) -> bool:
    """A repository path (a ``*`` pattern matches at least one file)."""
    if "*" in name:
        return any(ROOT.glob(name))
    return (ROOT / name).exists()


def test_every_path_a_document_mentions_exists() -> None:
    """Each ``service/…``, ``stager/…``, ``tests/…``, ``bench/…``, ``deploy/…``,
    ``docs/…`` or ``.ci/…`` path in the documents names a file or directory of the
    repository."""
    found = mentions(PATH, DOCS)
    missing = [str(m) for m in found if not path_exists(m.name)]
    assert len(found) > 100
    assert not missing, "paths that do not exist:\n" + "\n".join(missing)


def test_every_dotted_name_resolves() -> None:
    """Each ``service.…``/``stager.…`` name in the documents and in the docstrings and
    comments of the code and tests is a module, or an attribute of one."""
    sources = [*DOCS, *(p for p in files(*CODE) if is_python(p))]
    found = mentions(DOTTED, sources)
    missing = [str(m) for m in found if not resolves(m.name)]
    assert len(found) > 100
    assert not missing, "names that do not resolve:\n" + "\n".join(missing)


def test_every_cited_document_exists() -> None:
    """Each ``*.md`` file a document or a comment cites is in the repository, relative to
    the citing file or to the repository's root (an absolute, installed path is not a
    citation)."""
    found = mentions(CITED, [*DOCS, *files(*COMMENTED)])
    missing = [
        str(m)
        for m in found
        if not m.name.startswith("/")
        and not ((m.file.parent / m.name).is_file() or (ROOT / m.name).is_file())
    ]
    assert len(found) > 20
    assert not missing, "cited documents that are not in the repository:\n" + "\n".join(missing)


def modules() -> list[str]:
    """Every module and package of ``service`` and ``stager``, as a dotted name."""
    out = []
    for package in ("service", "stager"):
        for path in sorted((ROOT / package).rglob("*.py")):
            parts = path.relative_to(ROOT).with_suffix("").parts
            out.append(".".join(parts[:-1] if parts[-1] == "__init__" else parts))
    return out


def as_module(name: str) -> str:
    """A path (``service/bundles/state.py``, ``service/verify/``) or dotted name, as a module."""
    return name.removesuffix(".py").strip("/").replace("/", ".")


@pytest.mark.parametrize("kind", ["service", "stager"])
def test_the_architecture_map_names_every_module(kind: str) -> None:
    """``docs/architecture.md`` names every module and package of ``service`` and
    ``stager``, by path or by dotted name."""
    doc = [ROOT / "docs" / "architecture.md"]
    named = {as_module(m.name) for m in mentions(PATH, doc) + mentions(DOTTED, doc)}
    left_out = [m for m in modules() if m.split(".")[0] == kind and m not in named]
    assert not left_out, "docs/architecture.md does not name:\n" + "\n".join(left_out)


def test_the_checks_name_a_stale_mention(tmp_path: Path) -> None:
    """A document naming a removed path, module or document, and a comment citing a
    missing ``*.md``, are each found at their line and fail to resolve."""
    doc = tmp_path / "stale.md"
    doc.write_text(
        "See `service/verify/x509.py` and\n"
        ":mod:`service.verify.x509` (`service.bundles.state.BundleState.nothing`),\n"
        "then REMOVED-NOTES.md, service.cli and `docs/kernel.md`.\n"
    )
    code = tmp_path / "stale.py"
    code.write_text('"""Read ../NOTES.md."""\n\nX = "service.nowhere"  # see service.nowhere.y\n')
    paths = mentions(PATH, [doc])
    names = mentions(DOTTED, [doc, code])
    cited = mentions(CITED, [doc, code])
    assert [(m.line, m.name) for m in paths] == [
        (1, "service/verify/x509.py"),
        (3, "docs/kernel.md"),
    ]
    assert [path_exists(m.name) for m in paths] == [False, True]
    assert [(m.file.name, m.line, m.name, resolves(m.name)) for m in names] == [
        ("stale.md", 2, "service.verify.x509", False),
        ("stale.md", 2, "service.bundles.state.BundleState.nothing", False),
        ("stale.md", 3, "service.cli", True),
        ("stale.py", 3, "service.nowhere.y", False),
    ]
    assert [(m.line, m.name) for m in cited] == [
        (3, "REMOVED-NOTES.md"),
        (3, "docs/kernel.md"),
        (1, "../NOTES.md"),
    ]
    assert str(names[0]) == f"{doc}:2: service.verify.x509"


def test_the_kernel_rules_in_the_docs_are_the_code_table_row_by_row() -> None:
    """docs/kernel.md's table of the kernel's rules is `service.verify.targetkernel.rules.ROWS`
    rendered cell by cell (each rule, the functions it mirrors, its symbol or release and
    commit, what is assumed unread, its knob): a row changed in one shows here."""
    from tests.rules_doc import HEADER, render

    text = (ROOT / "docs/kernel.md").read_text()
    at = text.index(HEADER[0])
    table = text[at:].split("\n\n")[0].splitlines()
    assert table == render()


def test_every_commit_a_rule_names_is_cited_in_the_docs_with_its_release() -> None:
    """Wherever docs/ cite a commit a rule of `service.verify.targetkernel.rules.ROWS` is decided
    by (a table row, a paragraph), they give the release the table decides it at: a row
    moved to another release and a doc left saying the old one show here."""
    from service.verify.targetkernel.rules import ROWS, Symbol

    blocks = [
        block
        for doc in sorted((ROOT / "docs").glob("*.md"))
        for part in doc.read_text().split("\n\n")
        for block in (part.splitlines() if part.lstrip().startswith("|") else [part])
    ]
    cited, commits = 0, 0
    for row in ROWS:
        if isinstance(row.decided_by, Symbol):
            continue
        release = "{}.{}".format(*row.decided_by.release)
        for commit in re.findall(r"\b[0-9a-f]{12}\b", row.decided_by.commit):
            commits += 1
            for block in blocks:
                if commit in block:
                    cited += 1
                    assert re.search(rf"(?<![\d.]){re.escape(release)}(?![\d])", block), (
                        row.knob,
                        block[:200],
                    )
    assert cited > commits  # cited beyond the generated table

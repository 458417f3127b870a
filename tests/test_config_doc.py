"""docs/config.md's tables are the config the code reads: every key, its type, its default.

The tables are parsed (one per ``## `[table]``` section; "Top level" for the top level) and
held to :class:`service.config.Config` both ways: the keys the records and the ``[reboot]``
reader accept are exactly the documented ones; a documented default, written into a file,
loads to the same config as leaving the key out; an example loads and changes it; a value of
another type than the documented one is refused, naming the key and the value.
"""

from __future__ import annotations

import dataclasses
import operator
import re
import tomllib
from collections.abc import Callable
from pathlib import Path
from typing import Any, NamedTuple

import pytest

from service.config import REBOOT_KEYS, BundlePolicy, Config
from service.errors import ConfigError

DOC = Path(__file__).resolve().parents[1] / "docs" / "config.md"
SECTION = re.compile(r"## (?:Top level|`\[(?P<table>\w+(?:\.<name>)?)\]`)\s*\Z")
#: the table name a ``[bundles.<name>]`` row is tried under
SAMPLE = "demo"


def _strings(value: Any) -> bool:
    return isinstance(value, list) and all(isinstance(v, str) for v in value)


#: the documented types, each as a test of a parsed TOML value
TYPES: dict[str, Callable[[Any], bool]] = {
    "integer": lambda v: isinstance(v, int) and not isinstance(v, bool),
    "number": lambda v: isinstance(v, int | float) and not isinstance(v, bool),
    "boolean": lambda v: isinstance(v, bool),
    "string": lambda v: isinstance(v, str),
    "path": lambda v: isinstance(v, str),
    "array of strings": _strings,
    "array of paths": _strings,
    "table of paths": lambda v: isinstance(v, dict) and all(isinstance(p, str) for p in v.values()),
}


class Row(NamedTuple):
    """One documented key: its table ('' at the top level), its cells, its line."""

    table: str
    key: str
    type: str
    default: str  # TOML text, or "unset"
    example: str
    line: int

    @property
    def tables(self) -> list[str]:
        """The tables the key is in, outermost first (``<name>`` as :data:`SAMPLE`)."""
        return self.table.replace("<name>", SAMPLE).split(".") if self.table else []

    @property
    def path(self) -> str:
        """The key's dotted path, as problems name it."""
        return ".".join([*self.tables, self.key])

    def _nested(self, innermost: dict[str, Any]) -> dict[str, Any]:
        for name in reversed(self.tables):
            innermost = {name: innermost}
        return innermost

    def document(self, value: Any) -> dict[str, Any]:
        """A parsed config.toml setting this key to ``value`` and nothing else."""
        return self._nested({self.key: value})

    def value(self, config: Config) -> Any:
        """The key's value in ``config`` (a ``[bundles.<name>]`` key: in the policy of
        :data:`SAMPLE`)."""
        if self.table == "bundles.<name>":
            return getattr(config.bundle_policy(SAMPLE), self.key)
        return operator.attrgetter(self.path)(config)

    def without(self) -> Config:
        """The config of a file that leaves this key out (its table, if any, is present)."""
        return Config.from_dict(self._nested({}))


def toml_value(text: str) -> Any:
    """The value of a backticked TOML cell."""
    assert text.startswith("`") and text.endswith("`"), text
    return tomllib.loads(f"v = {text[1:-1]}")["v"]


def rows(text: str) -> list[Row]:
    """Every key row of the document's tables (``| `key` | type | default | what | example |``)."""
    out, table = [], None
    for n, line in enumerate(text.splitlines(), 1):
        if line.startswith("## "):
            match = SECTION.match(line)
            table = None if match is None else (match["table"] or "")
        elif line.startswith("| `") and table is not None:
            cells = [c.strip() for c in line.split("|")]
            assert len(cells) == 7, f"docs/config.md:{n}: a row has five cells, no '|' in one"
            _, key, kind, default, _what, example, _ = cells
            out.append(Row(table, key.strip("`"), kind, default, example, n))
    return out


ROWS = rows(DOC.read_text(encoding="utf-8"))


def code_keys() -> set[str]:
    """Every dotted key the config reads: a record's fields, a nested record's fields under
    its table, ``[reboot]``'s, which its own reader takes (``REBOOT_KEYS``), and a
    ``[bundles.<name>]`` table's (named :data:`SAMPLE`)."""
    keys, defaults = set(), Config()
    for f in dataclasses.fields(Config):
        value = getattr(defaults, f.name)
        if f.name == "reboot":
            keys |= {f"reboot.{k}" for k in REBOOT_KEYS}
        elif f.name == "bundles":
            keys |= {f"bundles.{SAMPLE}.{g.name}" for g in dataclasses.fields(BundlePolicy)}
        elif dataclasses.is_dataclass(value):
            keys |= {f"{f.name}.{g.name}" for g in dataclasses.fields(value)}
        else:
            keys.add(f.name)
    return keys


def test_the_doc_names_every_key_the_code_reads_and_no_other() -> None:
    """A key the code reads but the doc leaves out fails, as does a documented key the code
    does not read, or one documented twice."""
    documented = [r.path for r in ROWS]
    assert len(documented) == len(set(documented)), documented
    assert sorted(code_keys() - set(documented)) == [], "read but not in docs/config.md"
    assert sorted(set(documented) - code_keys()) == [], "in docs/config.md but not read"


@pytest.mark.parametrize("row", ROWS, ids=[r.path for r in ROWS])
def test_each_documented_default_is_what_applies_without_the_key(row: Row) -> None:
    """Written into a file, a documented default loads to the same config as leaving the key
    out, and is of the documented type; an "unset" key loads as no value."""
    assert row.type in TYPES, f"docs/config.md:{row.line}: unknown type {row.type!r}"
    if row.default == "unset":
        assert row.value(row.without()) is None
        return
    default = toml_value(row.default)
    assert TYPES[row.type](default), f"docs/config.md:{row.line}: default is not {row.type}"
    assert Config.from_dict(row.document(default)) == row.without(), (
        f"docs/config.md:{row.line}: {row.path} = {row.default} is not the default"
    )


@pytest.mark.parametrize("row", ROWS, ids=[r.path for r in ROWS])
def test_each_example_is_read_and_changes_the_config(row: Row) -> None:
    """A documented example is of the documented type, loads without a problem, and gives
    another config than the default (the key is read, not passed over)."""
    example = toml_value(row.example)
    assert TYPES[row.type](example), f"docs/config.md:{row.line}: example is not {row.type}"
    assert Config.from_dict(row.document(example)) != row.without()


@pytest.mark.parametrize("row", ROWS, ids=[r.path for r in ROWS])
def test_a_value_of_another_type_is_refused_naming_key_and_value(row: Row) -> None:
    """A number where a string is documented (a string elsewhere) is one problem that
    starts with the key's path and the value; 1.5 is refused exactly where the doc says
    integer, and an integer key takes no fraction while a number key does."""
    wrong, shown = (4711, "4711") if row.type in ("string", "path") else ("x4711", "'x4711'")
    with pytest.raises(ConfigError) as info:
        Config.from_dict(row.document(wrong))
    assert [p for p in info.value.problems if p.startswith(f"{row.path}: {shown} ")] == list(
        info.value.problems
    )
    if row.type == "integer":
        with pytest.raises(ConfigError, match=re.escape(f"{row.path}: 1.5 is not")):
            Config.from_dict(row.document(1.5))
    elif row.type == "number":
        Config.from_dict(row.document(1.5))

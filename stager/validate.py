"""Schema 1 validation: every problem collected, each naming its key, raised once.

The fields are read by the record converter (:mod:`stager.record`), each with the checks
:class:`~stager.manifest.Manifest` declares beside it. What is left here is what no one
field can say: the ``schema`` that decides how the rest is read, a file listed twice or a
module name loaded twice, a bundle after itself, and the size of the canonical form.
"""

from __future__ import annotations

from typing import Any

from stager.errors import ManifestError
from stager.manifest import MAX_MANIFEST_BYTES, SCHEMA, Manifest
from stager.paths import module_name
from stager.record import RecordError, describe, kind, load
from stager.shown import shown

MAX_PROBLEMS = 50
MAX_PROBLEM_CHARS = 512


class _Problems:
    """Problems found so far: at most :data:`MAX_PROBLEMS` kept, each escaped and bounded.

    A manifest is written by a container: a megabyte of unknown keys must not become a
    megabyte-long error in a status file, a log line or a terminal.
    """

    def __init__(self) -> None:
        self.items: list[str] = []
        self.dropped = 0

    def add(self, problem: str) -> None:
        if len(self.items) >= MAX_PROBLEMS:
            self.dropped += 1
            return
        self.items.append(shown(problem, MAX_PROBLEM_CHARS))

    def all(self) -> list[str]:
        more = [f"... and {self.dropped} more problems"] if self.dropped else []
        return self.items + more


def validate(data: dict[str, Any], source: str) -> Manifest:
    """Build a :class:`Manifest` from a parsed table or raise every problem at once."""
    p = _Problems()
    schema = data.get("schema")
    if "schema" not in data:
        p.add("schema: missing")
    elif not isinstance(schema, int) or isinstance(schema, bool):
        p.add(f"schema: must be {describe(int)}, not {kind(schema)}")
    elif schema != SCHEMA:  # a newer writer: its other keys mean nothing to this reader
        p.add(f"schema: unknown schema {schema} (this modstage reads schema {SCHEMA})")
        raise ManifestError(p.all(), source)
    fields = {key: value for key, value in data.items() if key != "schema"}
    manifest = None
    try:
        manifest = load(Manifest, fields)
    except RecordError as exc:
        for problem in exc.problems:
            p.add(problem)
    _itself(p, fields)
    _duplicates(p, fields)
    if p.items or manifest is None:
        raise ManifestError(p.all(), source)
    canonical = len(manifest.to_toml())
    if canonical > MAX_MANIFEST_BYTES:  # what the store keeps, and boot reads back
        p.add(f"manifest: canonical form is {canonical} bytes, over {MAX_MANIFEST_BYTES}")
        raise ManifestError(p.all(), source)
    return manifest


def _files(fields: dict[str, Any], key: str) -> list[tuple[str, str]]:
    """(``key[i]``, file) of each table of the array ``key`` whose ``file`` is a string."""
    value = fields.get(key)
    if not isinstance(value, list):
        return []
    return [
        (f"{key}[{i}]", table["file"])
        for i, table in enumerate(value)
        if isinstance(table, dict) and isinstance(table.get("file"), str)
    ]


def _duplicates(p: _Problems, fields: dict[str, Any]) -> None:
    """A file listed twice (module or firmware), a module name loaded twice."""
    modules = _files(fields, "module")
    seen: dict[str, str] = {}
    for key, file in modules + _files(fields, "firmware"):
        if file in seen:
            p.add(f"{key}.file: {file!r} is already listed as {seen[file]}.file")
        seen.setdefault(file, key)
    names: dict[str, str] = {}
    for key, file in modules:
        name = module_name(file)
        if name in names:
            p.add(f"{key}.file: module name {name!r} is already loaded by {names[name]}")
        names.setdefault(name, key)


def _itself(p: _Problems, fields: dict[str, Any]) -> None:
    """A bundle named in its own ``after``."""
    after, bundle = fields.get("after"), fields.get("bundle")
    if isinstance(after, list) and isinstance(bundle, str):
        for i, name in enumerate(after):
            if name == bundle:
                p.add(f"after[{i}]: a bundle cannot load after itself")

"""Schema 1 checks across fields, and the bound on what a manifest's problems may cost.

The fields are read by the record converter (:mod:`stager.schema.record`), each with the checks
:class:`~stager.schema.manifest.Manifest` declares beside it, and the manifest reads its own
``schema``. What is left here works on the parsed table before any field is trusted: what
no one field can say (a file listed twice or a module name loaded twice, a bundle after
itself), and :func:`bounded`, which keeps a container's garbage from becoming a
megabyte-long error.
"""

from __future__ import annotations

from typing import Any

from stager.schema.paths import module_name
from stager.schema.shown import shown

MAX_PROBLEMS = 50
MAX_PROBLEM_CHARS = 512


def bounded(problems: list[str]) -> list[str]:
    """At most :data:`MAX_PROBLEMS` problems, each escaped and cut to :data:`MAX_PROBLEM_CHARS`.

    A manifest is written by a container: a megabyte of unknown keys must not become a
    megabyte-long error in a status file, a log line or a terminal. The problems left out
    are counted in a last line.
    """
    kept = [shown(problem, MAX_PROBLEM_CHARS) for problem in problems[:MAX_PROBLEMS]]
    dropped = len(problems) - len(kept)
    return kept + ([f"... and {dropped} more problems"] if dropped else [])


def across_fields(fields: dict[str, Any]) -> list[str]:
    """What no one field can say: a bundle after itself, a file or a module name twice."""
    return _itself(fields) + _duplicates(fields)


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


def _duplicates(fields: dict[str, Any]) -> list[str]:
    """A file listed twice (module or firmware), a module name loaded twice."""
    problems = []
    modules = _files(fields, "module")
    seen: dict[str, str] = {}
    for key, file in modules + _files(fields, "firmware"):
        if file in seen:
            problems.append(f"{key}.file: {file!r} is already listed as {seen[file]}.file")
        seen.setdefault(file, key)
    names: dict[str, str] = {}
    for key, file in modules:
        name = module_name(file)
        if name in names:
            problems.append(f"{key}.file: module name {name!r} is already loaded by {names[name]}")
        names.setdefault(name, key)
    return problems


def _itself(fields: dict[str, Any]) -> list[str]:
    """A bundle named in its own ``after``."""
    after, bundle = fields.get("after"), fields.get("bundle")
    if not (isinstance(after, list) and isinstance(bundle, str)):
        return []
    return [
        f"after[{i}]: a bundle cannot load after itself"
        for i, name in enumerate(after)
        if name == bundle
    ]

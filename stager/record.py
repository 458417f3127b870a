"""Frozen dataclasses to and from JSON-shaped values, driven by their fields.

Every record modstage persists or reads back (``state.json``'s records, status files,
``config.toml``, the ``status --json`` document) is a frozen dataclass, and this is the
one converter between it and plain values. :func:`dump` gives the plain form;
:func:`load` checks a parsed document against the field types, collects every
problem, each naming its key (``limits.max_files: must be an integer, not a string``),
and raises :class:`RecordError` once. Callers wrap the problems in their own error,
which names the file. Standard library only: the container side imports it too.

A field's ``metadata`` (built with :func:`spec`) may rename its key (a dotted key
nests it in :func:`dump`), leave it out of the plain form when a test holds, add a
check on the converted value, or replace the conversion for a shape of its own.
"""

from __future__ import annotations

import dataclasses
import enum
import functools
import types
import typing
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, TypeVar

R = TypeVar("R")
Problems = list[str]
Loader = Callable[[Any, str, Problems], Any]  # (value, key, problems) -> converted

_KINDS = {
    str: "a string",
    int: "an integer",
    float: "a number",
    bool: "a boolean",
    type(None): "null",
    list: "an array",
    tuple: "an array",
    dict: "a table",
    Path: "a string",
}


class RecordError(ValueError):
    """A document breaks its record's schema; ``problems`` says where and how, one each."""

    def __init__(self, problems: Problems) -> None:
        self.problems = tuple(problems)
        super().__init__("; ".join(self.problems))


def spec(
    *,
    key: str | None = None,
    omit: Callable[[Any], bool] | None = None,
    check: Callable[[Any], str | None] | None = None,
    load: Loader | None = None,
    dump: Callable[[Any], Any] | None = None,
    required: bool = False,
) -> dict[str, Any]:
    """A field's metadata: its ``key``, when to ``omit`` it from the plain form, a
    ``check`` of the converted value (a problem or None), a ``load``/``dump`` of its own,
    and whether a document must have the key although the field has a default."""
    given: dict[str, Any] = {"key": key, "omit": omit, "check": check, "load": load}
    given["dump"] = dump
    given["required"] = required or None
    return {k: v for k, v in given.items() if v is not None}


def is_none(value: Any) -> bool:
    """An ``omit`` test: the key is absent when the value is None."""
    return value is None


def is_empty(value: Any) -> bool:
    """An ``omit`` test: the key is absent when the value is empty or false."""
    return not value


def dump(record: Any) -> dict[str, Any]:
    """The plain form of a dataclass instance: nested records, enums (their value),
    paths (text), tuples (lists) and mappings made plain, keys as their fields name them."""
    doc: dict[str, Any] = {}
    for f in dataclasses.fields(record):
        value = getattr(record, f.name)
        if (omit := f.metadata.get("omit")) is not None and omit(value):
            continue
        plain = f.metadata["dump"](value) if "dump" in f.metadata else _plain(value)
        *groups, last = f.metadata.get("key", f.name).split(".")
        into = doc
        for group in groups:
            into = into.setdefault(group, {})
        into[last] = plain
    return doc


def _plain(value: Any) -> Any:
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return dump(value)
    if isinstance(value, enum.Enum):
        return value.value
    if isinstance(value, Path):
        return str(value)
    if isinstance(value, Mapping):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_plain(v) for v in value]
    return value


def load(cls: type[R], value: Any, where: str = "", *, unknown: str = "refuse") -> R:
    """``cls`` built from the plain ``value``; raises :class:`RecordError` with every problem.

    ``where`` prefixes each problem's key; ``unknown="ignore"`` passes over keys the record
    does not know (a reader of a newer writer's file), ``"refuse"`` names each one.
    """
    problems: Problems = []
    record = _record(cls, value, where, problems, unknown)
    if problems:
        raise RecordError(problems)
    return typing.cast(R, record)


def join(where: str, key: str) -> str:
    """The key ``key`` inside ``where`` (``limits`` and ``max_files``: ``limits.max_files``)."""
    return f"{where}.{key}" if where else key


def kind(value: Any) -> str:
    """What a parsed value is, in the words problems use (``a string``, ``an array``)."""
    return _KINDS.get(type(value), type(value).__name__)


@functools.cache
def _hints(cls: type) -> dict[str, Any]:
    return typing.get_type_hints(cls)


def _record(cls: type, value: Any, where: str, problems: Problems, unknown: str) -> Any:
    if not isinstance(value, dict):
        problems.append(f"{where or 'document'}: must be a table, not {kind(value)}")
        return None
    hints = _hints(cls)
    by_key = {f.metadata.get("key", f.name): f for f in dataclasses.fields(cls) if f.init}
    if unknown == "refuse":
        problems += [f"{join(where, k)}: unknown key" for k in sorted(set(value) - set(by_key))]
    values: dict[str, Any] = {}
    before = len(problems)
    for key, f in by_key.items():
        at = join(where, key)
        if key not in value:
            if f.metadata.get("required") or (
                f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING
            ):
                problems.append(f"{at}: missing")
            continue
        mark = len(problems)
        if "load" in f.metadata:
            converted = f.metadata["load"](value[key], at, problems)
        else:
            converted = _convert(hints[f.name], value[key], at, problems, unknown)
        check = f.metadata.get("check")
        if len(problems) == mark and check is not None and (why := check(converted)):
            problems.append(f"{at}: {why}")
        values[f.name] = converted
    return cls(**values) if len(problems) == before else None


class _Wrong(Exception):
    """The value is not of the hinted type (the caller words the problem)."""


def _convert(hint: Any, value: Any, at: str, problems: Problems, unknown: str) -> Any:
    try:
        return _typed(hint, value, at, problems, unknown)
    except _Wrong:
        problems.append(f"{at}: must be {describe(hint)}, not {kind(value)}")
        return None


def _typed(hint: Any, value: Any, at: str, problems: Problems, unknown: str) -> Any:
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if hint is Any:
        return value
    if origin in (typing.Union, types.UnionType):
        if value is None and type(None) in args:
            return None
        for choice in (a for a in args if a is not type(None)):
            try:
                return _typed(choice, value, at, problems, unknown)
            except _Wrong:
                continue
        raise _Wrong
    if origin in (tuple, list):
        if not isinstance(value, list):
            raise _Wrong
        items = [_convert(args[0], v, f"{at}[{i}]", problems, unknown) for i, v in enumerate(value)]
        return tuple(items) if origin is tuple else items
    if origin in (dict, Mapping):
        if not isinstance(value, dict):
            raise _Wrong
        return {k: _convert(args[1], v, join(at, k), problems, unknown) for k, v in value.items()}
    if isinstance(hint, type) and dataclasses.is_dataclass(hint):
        if not isinstance(value, dict):
            raise _Wrong
        return _record(hint, value, at, problems, unknown)
    if isinstance(hint, type) and issubclass(hint, enum.Enum):
        try:
            return hint(value)
        except ValueError:
            problems.append(f"{at}: {value!r} is not one of {'|'.join(str(m.value) for m in hint)}")
            return None
    return _scalar(hint, value)


def _scalar(hint: Any, value: Any) -> Any:
    if isinstance(value, bool) and hint is not bool:
        raise _Wrong  # true is not 1 here
    if hint is float and isinstance(value, int | float):
        return float(value)
    if hint is Path and isinstance(value, str):
        return Path(value)
    if isinstance(hint, type) and isinstance(value, hint):
        return value
    raise _Wrong


def describe(hint: Any) -> str:
    """A type hint in the words problems use (``str | None``: ``a string or null``)."""
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin in (typing.Union, types.UnionType):
        words = [describe(a) for a in args if a is not type(None)]
        return " or ".join(words + (["null"] if type(None) in args else []))
    if origin in (tuple, list):
        return f"an array of {_plural(args[0])}"
    if origin in (dict, Mapping) or dataclasses.is_dataclass(hint):
        return "a table"
    if isinstance(hint, type) and issubclass(hint, enum.Enum):
        return f"one of {'|'.join(str(m.value) for m in hint)}"
    return _KINDS.get(hint, getattr(hint, "__name__", str(hint)))


def _plural(hint: Any) -> str:
    if isinstance(hint, type) and issubclass(hint, enum.Enum):
        return f"values among {'|'.join(str(m.value) for m in hint)}"
    if typing.get_origin(hint) in (dict, Mapping) or dataclasses.is_dataclass(hint):
        return "tables"
    word = describe(hint)
    return f"{word.split(' ', 1)[1]}s" if word.startswith(("a ", "an ")) else "values"

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
    required: bool | str = False,
) -> dict[str, Any]:
    """A field's metadata: its ``key``, when to ``omit`` it from the plain form, a
    ``check`` of the converted value (a problem or None), a ``load``/``dump`` of its own,
    and whether a document must have the key although the field has a default (a text:
    why, added to the problem ``missing``)."""
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


Convert = Callable[[Any, str, Problems, str], Any]  # (value, key, problems, unknown)


class _Wrong(Exception):
    """The value is not of the hinted type (the caller words the problem)."""


class _Field(typing.NamedTuple):
    """How one field is read: worked out once per record class (:func:`_fields`)."""

    key: str
    name: str
    missing: str | None  # the problem when the key is absent; None: the default holds
    load: Loader | None  # the field's own reader (``spec(load=)``)
    convert: Convert | None  # or the one for its type hint
    check: Callable[[Any], str | None] | None


@functools.cache
def _fields(cls: type) -> tuple[tuple[_Field, ...], frozenset[str]]:
    """The fields of ``cls`` as it reads them, and their keys."""
    hints = typing.get_type_hints(cls)
    out = []
    for f in dataclasses.fields(cls):
        if not f.init:
            continue
        needed = f.metadata.get("required")
        missing = None
        if needed or (
            f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING
        ):
            missing = "missing" + (f" ({needed})" if isinstance(needed, str) else "")
        own = f.metadata.get("load")
        convert = None if own is not None else _converter(hints[f.name])
        key = f.metadata.get("key", f.name)
        out.append(_Field(key, f.name, missing, own, convert, f.metadata.get("check")))
    return tuple(out), frozenset(f.key for f in out)


def _record(cls: type, value: Any, where: str, problems: Problems, unknown: str) -> Any:
    if not isinstance(value, dict):
        problems.append(f"{where or 'document'}: must be a table, not {kind(value)}")
        return None
    fields, keys = _fields(cls)
    if unknown == "refuse" and (extra := value.keys() - keys):
        problems += [f"{join(where, k)}: unknown key" for k in sorted(extra)]
    values: dict[str, Any] = {}
    before = len(problems)
    for f in fields:
        at = join(where, f.key)
        if f.key not in value:
            if f.missing is not None:
                problems.append(f"{at}: {f.missing}")
            continue
        mark = len(problems)
        if f.load is not None:
            converted = f.load(value[f.key], at, problems)
        else:
            assert f.convert is not None  # one of the two, by _fields
            converted = f.convert(value[f.key], at, problems, unknown)
        if len(problems) == mark and f.check is not None and (why := f.check(converted)):
            problems.append(f"{at}: {why}")
        values[f.name] = converted
    return cls(**values) if len(problems) == before else None


@functools.cache
def _converter(hint: Any) -> Convert:
    """The reader of a value of type ``hint``; a wrong type becomes the problem
    ``must be <hint in words>, not <what it is>``."""
    typed, said = _typed(hint), describe(hint)

    def convert(value: Any, at: str, problems: Problems, unknown: str) -> Any:
        try:
            return typed(value, at, problems, unknown)
        except _Wrong:
            problems.append(f"{at}: must be {said}, not {kind(value)}")
            return None

    return convert


@functools.cache
def _typed(hint: Any) -> Convert:
    """The reader of a value of type ``hint`` that raises :class:`_Wrong` on another type."""
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if hint is Any:
        return lambda value, at, problems, unknown: value
    if origin in (typing.Union, types.UnionType):
        return _union([_typed(a) for a in args if a is not type(None)], type(None) in args)
    if origin in (tuple, list):
        return _sequence(_converter(args[0]), origin is tuple)
    if origin in (dict, Mapping):
        item = _converter(args[1])

        def table(value: Any, at: str, problems: Problems, unknown: str) -> Any:
            if not isinstance(value, dict):
                raise _Wrong
            return {k: item(v, join(at, k), problems, unknown) for k, v in value.items()}

        return table
    if isinstance(hint, type) and dataclasses.is_dataclass(hint):

        def record(value: Any, at: str, problems: Problems, unknown: str) -> Any:
            if not isinstance(value, dict):
                raise _Wrong
            return _record(hint, value, at, problems, unknown)

        return record
    if isinstance(hint, type) and issubclass(hint, enum.Enum):
        return _member(hint)
    return lambda value, at, problems, unknown: _scalar(hint, value)


def _union(choices: list[Convert], nullable: bool) -> Convert:
    def union(value: Any, at: str, problems: Problems, unknown: str) -> Any:
        if value is None and nullable:
            return None
        for choice in choices:
            try:
                return choice(value, at, problems, unknown)
            except _Wrong:
                continue
        raise _Wrong

    return union


def _sequence(item: Convert, as_tuple: bool) -> Convert:
    def sequence(value: Any, at: str, problems: Problems, unknown: str) -> Any:
        if not isinstance(value, list):
            raise _Wrong
        items = [item(v, f"{at}[{i}]", problems, unknown) for i, v in enumerate(value)]
        return tuple(items) if as_tuple else items

    return sequence


def _member(hint: type[enum.Enum]) -> Convert:
    allowed = "|".join(str(m.value) for m in hint)

    def member(value: Any, at: str, problems: Problems, unknown: str) -> Any:
        try:
            return hint(value)
        except ValueError:
            problems.append(f"{at}: {value!r} is not one of {allowed}")
            return None

    return member


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

"""The one record converter: plain form out, every problem in, named by its key."""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from stager.schema.record import RecordError, dump, is_empty, is_none, load, spec


class Mode(enum.Enum):
    ON = "on"
    OFF = "off"


@dataclass(frozen=True)
class Inner:
    name: str
    size: int = 0


@dataclass(frozen=True)
class Outer:
    source: str = field(metadata=spec(key="from"))
    at: float
    mode: Mode = Mode.ON
    tags: tuple[str, ...] = ()
    inner: Inner | None = None
    table: Mapping[str, Inner] = field(default_factory=dict)
    note: str = field(default="", metadata=spec(omit=is_empty))
    path: Path | None = field(default=None, metadata=spec(omit=is_none))
    count: int = field(default=1, metadata=spec(check=lambda n: None if n > 0 else "must be > 0"))
    kept: bool = field(default=False, metadata=spec(required=True))
    where: str = field(default="x", metadata=spec(key="place.name"))


def test_the_plain_form_renames_nests_omits_and_makes_values_plain() -> None:
    """Keys as the fields name them, a dotted key nested, omitted keys absent, enums,
    tuples, paths and nested records plain."""
    record = Outer("a", 1.5, Mode.OFF, ("t",), Inner("i", 2), {"k": Inner("j")}, path=Path("/p"))
    assert dump(record) == {
        "from": "a",
        "at": 1.5,
        "mode": "off",
        "tags": ["t"],
        "inner": {"name": "i", "size": 2},
        "table": {"k": {"name": "j", "size": 0}},
        "path": "/p",
        "count": 1,
        "kept": False,
        "place": {"name": "x"},
    }


@given(
    st.builds(
        Outer,
        source=st.text(),
        at=st.floats(allow_nan=False),
        mode=st.sampled_from(Mode),
        tags=st.lists(st.text()).map(tuple),
        inner=st.none() | st.builds(Inner, st.text(), st.integers()),
        table=st.dictionaries(st.text(), st.builds(Inner, st.text(), st.integers())),
        note=st.text(),
        count=st.integers(min_value=1),
        kept=st.booleans(),
    )
)
def test_what_is_dumped_loads_back_equal(record: Outer) -> None:
    """load(dump(r)) == r for any record the fields allow (dotted keys aside)."""
    plain = dump(record)
    plain["place.name"] = plain.pop("place")["name"]
    assert load(Outer, plain) == record


def test_every_problem_is_collected_and_named_by_its_key() -> None:
    """A document with several faults raises once, listing each with its key path."""
    with pytest.raises(RecordError) as info:
        load(
            Outer,
            {
                "from": 3,
                "at": True,
                "mode": "dim",
                "tags": ["a", 1],
                "inner": {"size": "big", "x": 1},
                "count": 0,
                "extra": None,
            },
            "doc",
        )
    assert set(info.value.problems) == {
        "doc.extra: unknown key",
        "doc.from: must be a string, not an integer",
        "doc.at: must be a number, not a boolean",
        "doc.mode: 'dim' is not one of on|off",
        "doc.tags[1]: must be a string, not an integer",
        "doc.inner.x: unknown key",
        "doc.inner.name: missing",
        "doc.inner.size: must be an integer, not a string",
        "doc.count: must be > 0",
        "doc.kept: missing",
    }


def test_unknown_keys_are_ignored_when_asked_and_defaults_fill_the_rest() -> None:
    """A reader of a newer writer's file passes over keys it does not know."""
    loaded = load(Outer, {"from": "a", "at": 1, "kept": True, "new": 1}, unknown="ignore")
    assert loaded == Outer("a", 1.0, kept=True)
    with pytest.raises(RecordError, match="new: unknown key"):
        load(Outer, {"from": "a", "at": 1, "kept": True, "new": 1})


def test_a_document_that_is_not_a_table_is_one_problem() -> None:
    """A list where a record belongs is refused, not indexed."""
    with pytest.raises(RecordError, match="document: must be a table, not an array"):
        load(Inner, [])


@given(
    st.one_of(
        st.integers(), st.text(), st.lists(st.integers()), st.dictionaries(st.text(), st.none())
    )
)
def test_any_wrong_value_is_a_problem_never_a_crash(value: object) -> None:
    """Whatever a document holds where a record expects a field, the converter names a
    problem (or accepts it), and never fails itself."""

    @dataclass(frozen=True)
    class Every:
        modes: tuple[Mode, ...] = ()
        table: Mapping[str, Inner] = field(default_factory=dict)
        inner: Inner | None = None
        maybe: int | float | None = None

    for key in ("modes", "table", "inner", "maybe"):
        try:
            load(Every, {key: value})
        except RecordError as exc:
            assert all(p.startswith(f"{key}") for p in exc.problems), exc.problems

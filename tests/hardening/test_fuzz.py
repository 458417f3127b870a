"""Hypothesis over the parsers that read what others wrote: manifest, config, state.

The property everywhere: no exception but the domain error, and whatever is accepted
round-trips. The module signature trailer, PKCS#7/CMS and ``.modinfo`` parsers are
fuzzed in tests/service/test_signature.py and tests/service/test_modinfo.py.
"""

from __future__ import annotations

import contextlib
import json
import tomllib
from pathlib import Path

import pytest
import tomli_w
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from service.bundles.phase import Phase
from service.bundles.records import HistoryEntry, RebootIntent
from service.bundles.state import BundleState, Generation, State
from service.bundles.statefile import decode, encode
from service.config import Config
from service.errors import ConfigError, StateError
from stager.schema.failures import ManifestError
from stager.schema.manifest import Manifest
from tests.strategies import manifest_tables, manifests, toml_tables, toml_values

# thousands of examples a test, a minute or more in all: out of the fast tier (tests/fast)
pytestmark = pytest.mark.fuzz
FUZZ = settings(max_examples=2000, deadline=None, suppress_health_check=[HealthCheck.too_slow])
# Recursive TOML tables cost ~15 ms an example to draw: fewer, to keep the suite under 3 min.
FUZZ_TABLES = settings(FUZZ, max_examples=600)
FUZZ_STATES = settings(FUZZ, max_examples=1000)


@FUZZ
@given(st.binary(max_size=600) | st.text(max_size=600).map(str.encode))
def test_manifest_bytes_raise_only_manifest_error(raw: bytes) -> None:
    """Arbitrary bytes: a Manifest or a ManifestError, nothing else."""
    with contextlib.suppress(ManifestError):
        Manifest.from_toml(raw)


def test_manifest_tables_raise_only_manifest_error_and_round_trip() -> None:
    """Manifest-shaped TOML tables, mostly valid (tests.strategies.manifest_tables): a valid
    one parses to exactly the manifest it was written from; any other is a ManifestError
    or a manifest; whatever parses re-reads equal from its canonical form. At least a
    third of the 600 tables round-trip, so that half runs (it ran for none of 600
    arbitrary tables)."""
    round_trips = 0

    @FUZZ_TABLES
    @given(manifest_tables())
    def check(case: tuple[Manifest | None, dict[str, object]]) -> None:
        nonlocal round_trips
        expected, data = case
        try:
            m = Manifest.from_toml(tomli_w.dumps(data).encode())
        except ManifestError as exc:
            assert expected is None, f"a valid manifest refused: {exc}"
            event("rejected")
            return
        event("accepted")
        assert expected is None or m == expected
        assert Manifest.from_toml(m.to_toml()) == m
        round_trips += 1

    check()
    print(f"manifest tables: {round_trips} round trips")
    assert round_trips >= FUZZ_TABLES.max_examples // 3, round_trips


@FUZZ_TABLES
@given(toml_tables)
def test_arbitrary_tables_raise_only_manifest_error(data: dict[str, object]) -> None:
    """Arbitrary TOML tables (almost never a manifest): a Manifest or a ManifestError."""
    with contextlib.suppress(ManifestError):
        Manifest.from_toml(tomli_w.dumps(data).encode())


def test_mutated_valid_manifests() -> None:
    """A valid manifest with one key replaced by any value: ManifestError or a round trip;
    some of the 600 are still accepted, so the round-trip half runs."""
    round_trips = 0

    @FUZZ_TABLES
    @given(manifests(), st.data())
    def check(m: Manifest, data: st.DataObject) -> None:
        nonlocal round_trips
        table = m.to_dict()
        key = data.draw(st.sampled_from(sorted(table)))
        table[key] = data.draw(toml_values)
        try:
            parsed = Manifest.from_dict(table)
        except ManifestError:
            return
        assert Manifest.from_toml(parsed.to_toml()) == parsed
        round_trips += 1

    check()
    print(f"mutated valid manifests: {round_trips} round trips")
    assert round_trips >= 5, round_trips


@FUZZ_TABLES
@given(toml_tables)
def test_config_tables_raise_only_config_error(data: dict[str, object]) -> None:
    """Arbitrary tables as config.toml: a Config or a ConfigError naming the problems."""
    try:
        Config.from_dict(data)
    except ConfigError as exc:
        assert exc.problems


@FUZZ
@given(st.binary(max_size=400))
def test_config_file_bytes_raise_only_config_error(raw: bytes) -> None:
    """Arbitrary bytes in config.toml: a Config or a ConfigError."""
    import tempfile

    with tempfile.TemporaryDirectory() as d:
        path = Path(d) / "config.toml"
        path.write_bytes(raw)
        with contextlib.suppress(ConfigError):
            Config.load(path)


def test_config_deeply_nested_is_a_config_error(tmp_path: Path) -> None:
    """A config nested deeper than Python recurses is a ConfigError, not a RecursionError."""
    path = tmp_path / "config.toml"
    path.write_text("a = " + "[" * 100_000 + "]" * 100_000)
    try:
        Config.load(path)
    except ConfigError as exc:
        assert "recursion" in str(exc)
    else:
        raise AssertionError("accepted")


_states = st.builds(
    State,
    bundles=st.dictionaries(
        st.text(max_size=6),
        st.builds(
            lambda gens, phase, hist: BundleState(
                phase=phase,
                active=next(iter(gens), None),
                pending=None,
                generations={g.id: g for g in gens.values()},
                history=hist,
            ),
            st.dictionaries(
                st.text("0123456789abcdef", min_size=1, max_size=8),
                st.builds(
                    Generation,
                    id=st.just(""),
                    version=st.text(max_size=5),
                    kernel=st.text(max_size=5),
                ),
                max_size=3,
            ).map(lambda d: {k: Generation(k, g.version, g.kernel) for k, g in d.items()}),
            st.sampled_from(list(Phase)),
            st.lists(
                st.builds(
                    HistoryEntry,
                    at=st.floats(0, 1e10),
                    source=st.text(max_size=5),
                    target=st.text(max_size=5),
                    note=st.text(max_size=5),
                ),
                max_size=3,
            ).map(tuple),
        ),
        max_size=3,
    ),
    boot_id=st.none() | st.text(max_size=10),
    reboot=st.none()
    | st.builds(
        RebootIntent,
        at=st.floats(0, 1e10),
        boot_id=st.none() | st.text(max_size=5),
        bundles=st.lists(st.text(max_size=5), max_size=2).map(tuple),
    ),
)


@FUZZ_STATES
@given(_states)
def test_state_round_trips(state: State) -> None:
    """Every state the service can build re-reads equal from its persisted form."""
    assert decode(encode(state)) == state


def _paths(doc: object, prefix: tuple[object, ...] = ()) -> list[tuple[object, ...]]:
    out = [prefix]
    if isinstance(doc, dict):
        for k, v in doc.items():
            out += _paths(v, (*prefix, k))
    elif isinstance(doc, list):
        for i, v in enumerate(doc):
            out += _paths(v, (*prefix, i))
    return out


@FUZZ_STATES
@given(_states, st.data())
def test_damaged_state_is_a_state_error_or_sound(state: State, data: st.DataObject) -> None:
    """One value of a valid state.json replaced by any JSON value: StateError, or a state
    that round-trips and whose active/pending generations are known."""
    doc = json.loads(encode(state))
    path = data.draw(st.sampled_from(_paths(doc)[1:] or [("format",)]))
    value = data.draw(
        st.none()
        | st.booleans()
        | st.integers()
        | st.floats(allow_nan=False)
        | st.text(max_size=5)
        | st.lists(st.integers(), max_size=2)
        | st.dictionaries(st.text(max_size=3), st.integers(), max_size=2)
    )
    target = doc
    for step in path[:-1]:
        target = target[step]  # type: ignore[index]
    target[path[-1]] = value  # type: ignore[index]
    try:
        parsed = decode(json.dumps(doc).encode())
    except StateError:
        return
    assert decode(encode(parsed)) == parsed
    for b in parsed.bundles.values():
        assert all(g in b.generations for g in b.keep())
        assert all(
            isinstance(g.attempts, int) and not isinstance(g.attempts, bool)
            for g in b.generations.values()
        )


@FUZZ
@given(st.binary(max_size=300))
def test_state_bytes_raise_only_state_error(raw: bytes) -> None:
    """Arbitrary bytes as state.json: a State or a StateError."""
    with contextlib.suppress(StateError):
        decode(raw)


def test_state_deeply_nested_is_a_state_error() -> None:
    """JSON nested deeper than Python recurses is a StateError, not a RecursionError."""
    try:
        decode(b"[" * 100_000)
    except StateError:
        pass
    else:
        raise AssertionError("accepted")


def test_tomllib_nesting_is_what_the_parsers_guard_against() -> None:
    """Sanity: tomllib itself raises RecursionError on deep nesting (why the guards exist)."""
    try:
        tomllib.loads("a = " + "[" * 100_000 + "]" * 100_000)
    except RecursionError:
        pass
    else:
        raise AssertionError("tomllib no longer recurses; the guards may go")

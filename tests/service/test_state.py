"""The phase machine and the persisted state file."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from service.errors import StateCorrupt, StateError
from service.store.state import (
    HISTORY_LIMIT,
    TRANSITIONS,
    BundleState,
    Generation,
    Phase,
    State,
    load,
    next_phase,
    save,
)


@given(st.lists(st.sampled_from(list(Phase)), max_size=30))
def test_moves_follow_the_table_or_raise(targets: list[Phase]) -> None:
    """Any sequence of moves succeeds exactly when each step is in the transition table."""
    b = BundleState()
    for target in targets:
        if target in TRANSITIONS[b.phase]:
            b = b.move(target)
            assert b.phase is target
        else:
            with pytest.raises(StateError, match="illegal transition"):
                b.move(target)
    assert len(b.history) <= HISTORY_LIMIT


def test_the_table_allows_exactly_the_moves_modstage_makes() -> None:
    """Only the moves intake, the daemon and boot make are legal; shortcuts raise."""
    P = Phase
    made = {
        (P.NONE, P.PENDING),
        (P.PENDING, P.PENDING),
        (P.REBOOT_SCHEDULED, P.PENDING),
        (P.ACTIVE, P.PENDING),
        (P.FAILED, P.PENDING),  # intake
        (P.PENDING, P.REBOOT_SCHEDULED),  # daemon
        (P.PENDING, P.LOADING),
        (P.REBOOT_SCHEDULED, P.LOADING),
        (P.ACTIVE, P.LOADING),
        (P.FAILED, P.LOADING),
        (P.LOADING, P.LOADING),
        (P.LOADING, P.ACTIVE),
        (P.LOADING, P.FAILED),  # boot
    }
    assert {(a, b) for a, targets in TRANSITIONS.items() for b in targets} == made
    for illegal in [
        (P.ACTIVE, P.FAILED),
        (P.NONE, P.ACTIVE),
        (P.PENDING, P.ACTIVE),
        (P.VERIFYING, P.PENDING),
    ]:
        with pytest.raises(StateError):
            next_phase(*illegal)


def test_history_is_bounded() -> None:
    """However many moves, the history keeps the newest HISTORY_LIMIT."""
    b = BundleState()
    for _ in range(HISTORY_LIMIT + 10):
        b = b.move(Phase.PENDING)
    assert len(b.history) == HISTORY_LIMIT


def test_round_trip_through_the_file(tmp_path: Path) -> None:
    """What is saved is what is loaded."""
    gen = Generation("a" * 64, "1.0", "6.1.0-57-amd64", added=1.5, attempts=2, failed="x")
    state = State(
        {"nvidia": BundleState().with_generation(gen).move(Phase.PENDING, pending=gen.id)}, "boot"
    )
    save(tmp_path / "state.json", state)
    assert load(tmp_path / "state.json") == state


@pytest.mark.parametrize("content", [b"{", b"[]", b'{"format": 9}', b'{"format": 1}', b"\xff"])
def test_corrupt_state_is_moved_aside_not_reset(tmp_path: Path, content: bytes) -> None:
    """An unreadable state file is renamed aside and reported; nothing is silently reset."""
    path = tmp_path / "state.json"
    path.write_bytes(content)
    with pytest.raises(StateCorrupt) as info:
        load(path)
    assert not path.exists()
    assert Path(info.value.aside).read_bytes() == content
    assert info.value.aside.startswith(str(path) + ".corrupt-")
    with pytest.raises(StateCorrupt, match="an earlier state file was corrupt"):
        load(path)  # and on every later run, until an admin decides


def test_a_reboot_intent_without_its_time_is_a_corrupt_state(tmp_path: Path) -> None:
    """A hand-edited reboot record without ``at`` is refused where state.json is read (a
    StateError naming the key), never a KeyError later in the daemon's reboot decision."""
    import json

    from service.store.state import State, read, save

    path = tmp_path / "state.json"
    save(path, State({}, boot_id="b", reboot={"at": 1.0, "boot_id": "b", "backend": "none"}))
    assert read(path).reboot == {"at": 1.0, "boot_id": "b", "backend": "none"}
    doc = json.loads(path.read_text())
    del doc["reboot"]["at"]
    path.write_text(json.dumps(doc))
    with pytest.raises(StateError, match="reboot intent's 'at'"):
        read(path)

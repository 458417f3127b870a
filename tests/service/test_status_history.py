"""Every history entry the plain ``status`` view prints carries its own note, even when the
same note was printed before (a rollback made again after it was cancelled)."""

from __future__ import annotations

import re

from service.bundles.statefile import load
from service.layout import Layout
from tests.service.test_admin import cli, failed_upgrade, layout

__all__ = ["layout"]  # the host fixture, shared with the admin verbs' tests
STAMPED = re.compile(r"  \d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ ")  # a history line


def test_a_repeated_rollback_shows_its_note_again(layout: Layout) -> None:
    """rollback, its cancel, the same rollback again: state.json records three notes, and
    each of the history lines status prints ends with the note of its own entry."""
    v1, v2, _v3 = failed_upgrade(layout)
    for gen in (v1, v2, v1):  # roll back, cancel it, roll back again
        assert cli(layout, "rollback", "nvidia", gen[:12])[0] == 0
    history = load(layout.state).bundle("nvidia").history[-5:]
    rollbacks = [h.note for h in history if h.note.startswith(f"admin: rollback to {v1[:12]}")]
    assert len(rollbacks) == 2 and rollbacks[0] == rollbacks[1]
    _code, text = cli(layout, "status")
    moves = [ln for ln in text.splitlines() if STAMPED.match(ln)]
    assert len(moves) == len(history), text  # one line per entry, in order
    for h, line in zip(history, moves, strict=True):
        assert line.endswith(h.note), (h, line)

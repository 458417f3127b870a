"""What the intake child tells the daemon: progress ticks, then one typed result line.

The child (:mod:`service.cmd.intake_child`) writes :data:`TICK` lines while it makes
progress, a :func:`building` line when it starts and ends copying and verifying a drop
(the drop a child killed meanwhile is rejected for it), and ends with one JSON object,
:meth:`ChildResult.to_json`; the daemon
(:mod:`service.daemon.intake_runner`) reads it back with :meth:`ChildResult.from_json`,
which refuses anything malformed. A failed run carries its error, and when the state file
was corrupt, the fields :class:`~service.errors.StateCorrupt` is made of.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from service.errors import ServiceError, StateCorrupt
from service.intake.outcome import Outcome

TICK = b"tick\n"
BUILDING = b"building "


def building(drop: str | None) -> bytes:
    """The line saying the child copies and verifies ``drop`` now (None: no drop any more)."""
    return BUILDING + json.dumps(drop).encode() + b"\n"


def built(line: bytes) -> str | None:
    """The drop a :func:`building` line names (None: none); ValueError if it is not one."""
    if not line.startswith(BUILDING):
        raise ValueError("not a building line")
    drop = json.loads(line[len(BUILDING) :])
    if drop is not None and not isinstance(drop, str):
        raise ValueError("a building line names a drop or null")
    return drop


@dataclass(frozen=True)
class Corrupt:
    """``state.json`` was unreadable and moved aside (:class:`StateCorrupt`'s fields)."""

    path: str
    aside: str
    reason: str


@dataclass(frozen=True)
class ChildResult:
    """One intake run in the child: its outcomes, or why the run failed as a whole."""

    outcomes: tuple[Outcome, ...] = ()
    stuck: dict[str, str] = field(default_factory=dict)  # drops that could not be removed
    error: str | None = None  # the run failed as a whole
    corrupt: Corrupt | None = None

    @classmethod
    def failed(cls, exc: BaseException, shown: str) -> ChildResult:
        """The result of a run that raised ``exc`` (shown to the admin as ``shown``)."""
        if isinstance(exc, StateCorrupt):
            return cls(error=shown, corrupt=Corrupt(exc.path, exc.aside, exc.reason))
        return cls(error=shown)

    def raise_failure(self) -> None:
        """Raise what the child's run raised, as a :class:`ServiceError` (nothing if it ran)."""
        if self.corrupt is not None:
            raise StateCorrupt(self.corrupt.path, self.corrupt.aside, self.corrupt.reason)
        if self.error is not None:
            raise ServiceError(f"intake (child process): {self.error}")

    def to_json(self) -> dict[str, Any]:
        """The result line's object."""
        if self.error is not None:
            corrupt = None if self.corrupt is None else vars(self.corrupt)
            return {"error": self.error, "corrupt": corrupt}
        return {"outcomes": [o.to_json() for o in self.outcomes], "stuck": self.stuck}

    @classmethod
    def from_json(cls, doc: object) -> ChildResult:
        """A result line's object; ValueError when it is not one."""
        if not isinstance(doc, dict):
            raise ValueError("not a JSON object")
        if "outcomes" in doc:
            stuck = doc.get("stuck", {})
            if not isinstance(doc["outcomes"], list) or not isinstance(stuck, dict):
                raise ValueError("outcomes must be a list and stuck an object")
            outcomes = tuple(Outcome.from_json(o) for o in doc["outcomes"])
            return cls(outcomes, {str(k): str(v) for k, v in stuck.items()})
        error, corrupt = doc.get("error"), doc.get("corrupt")
        if not isinstance(error, str):
            raise ValueError("neither outcomes nor an error")
        if corrupt is None:
            return cls(error=error)
        if not isinstance(corrupt, dict) or set(corrupt) != {"path", "aside", "reason"}:
            raise ValueError("corrupt must be an object with path, aside and reason")
        return cls(
            error=error, corrupt=Corrupt(*(str(corrupt[k]) for k in ("path", "aside", "reason")))
        )

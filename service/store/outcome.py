"""What became of one drop: the record intake returns, and its JSON form.

Kept apart from :mod:`service.store.intake` so that the daemon, which runs intake in a
child process (:mod:`service.daemon.intake_runner`), can read outcomes back without
importing the verification stack.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any


@dataclass(frozen=True)
class Outcome:
    """What became of one drop."""

    drop: Path
    bundle: str | None
    generation: str | None
    accepted: bool
    reasons: tuple[str, ...] = ()
    deferred: bool = False  # the host failed; the drop is kept and retried
    seconds: float | None = None  # how long taking it in took (copy and verification)
    gone: bool = False  # vanished before it could be taken (another intake took it)

    def to_json(self) -> dict[str, Any]:
        """A JSON-ready dict (the drop as a string path)."""
        return {
            "drop": str(self.drop),
            "bundle": self.bundle,
            "generation": self.generation,
            "accepted": self.accepted,
            "reasons": list(self.reasons),
            "deferred": self.deferred,
            "seconds": self.seconds,
            "gone": self.gone,
        }

    @classmethod
    def from_json(cls, doc: dict[str, Any]) -> Outcome:
        """The outcome :meth:`to_json` wrote (a ``KeyError`` or ``TypeError`` if it is not one)."""
        seconds = doc["seconds"]
        return cls(
            drop=Path(doc["drop"]),
            bundle=_optional_str(doc["bundle"]),
            generation=_optional_str(doc["generation"]),
            accepted=bool(doc["accepted"]),
            reasons=tuple(str(r) for r in doc["reasons"]),
            deferred=bool(doc["deferred"]),
            seconds=None if seconds is None else float(seconds),
            gone=bool(doc["gone"]),
        )


def _optional_str(value: object) -> str | None:
    return None if value is None else str(value)

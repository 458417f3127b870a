"""What became of one drop: the record intake returns, and its JSON form.

Kept apart from :mod:`service.intake.scan` so that the daemon, which runs intake in a
child process (:mod:`service.daemon.intake_runner`), can read outcomes back without
importing the verification stack.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from stager.schema.record import dump, load


@dataclass(frozen=True)
class Outcome:
    """What became of one drop."""

    drop: Path
    bundle: str | None
    generation: str | None
    accepted: bool
    reasons: tuple[str, ...] = ()
    deferred: bool = False  # the drop is kept in incoming and taken again later
    seconds: float | None = None  # how long taking it in took (copy and verification)
    gone: bool = False  # vanished before it could be taken (another intake took it)
    # deferred because it must wait (a hold, an admin's pending rollback, the target
    # kernel's files not installed yet): not a failure; otherwise the host failed
    waiting: bool = False

    def to_json(self) -> dict[str, Any]:
        """A JSON-ready dict (the drop as a string path)."""
        return dump(self)

    @classmethod
    def from_json(cls, doc: Any) -> Outcome:
        """The outcome :meth:`to_json` wrote; a :class:`~stager.schema.record.RecordError`
        (a ValueError) naming each wrong or missing key if it is not one."""
        return load(cls, doc, "outcome")

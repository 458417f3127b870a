"""Errors raised by the container side.

::

    StagerError                 every failure of the stager package
    ├── ManifestError           a manifest breaks schema 1 (carries every problem found)
    ├── StageError              staging a drop failed (names the file and the reason)
    └── StatusFileError         a status file is unreadable or breaks its schema
                                (stager.schema.statusfile)
"""

from __future__ import annotations


class StagerError(Exception):
    """Root of every error raised by :mod:`stager`."""


class ManifestError(StagerError, ValueError):
    """A manifest is invalid; ``problems`` lists every problem, each naming its key."""

    def __init__(self, problems: list[str], source: str = "manifest") -> None:
        self.problems = tuple(problems)
        self.source = source
        super().__init__(f"{source}: " + "; ".join(self.problems))


class StageError(StagerError):
    """Staging failed because of ``path``; ``reason`` says why in plain words."""

    def __init__(self, path: object, reason: str) -> None:
        self.path = str(path)
        self.reason = reason
        super().__init__(f"{self.path}: {reason}")

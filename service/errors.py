"""Errors raised by the host side.

::

    ServiceError                    every failure of the service package
    ├── ConfigError                 /etc/modstage/config.toml is unreadable or invalid
    └── UsageError                  a command was called with arguments it cannot act on

Later parts add their leaves here (verification, intake, state, loading).
"""

from __future__ import annotations


class ServiceError(Exception):
    """Root of every error raised by :mod:`service`."""


class ConfigError(ServiceError):
    """The host configuration at ``path`` is invalid; ``problems`` says how."""

    def __init__(self, path: object, problems: list[str]) -> None:
        self.path = str(path)
        self.problems = tuple(problems)
        super().__init__(f"{self.path}: " + "; ".join(self.problems))


class UsageError(ServiceError):
    """A command cannot act on the arguments it was given."""

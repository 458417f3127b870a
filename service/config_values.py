"""How ``config.toml``'s values are shown in its problems, and the readers the tables share."""

from __future__ import annotations

from datetime import date, time
from typing import Any


def shown(value: Any) -> str:
    """A parsed value as a problem shows it: the way ``config.toml`` spells it (a string
    quoted as Python does), whole."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return repr(value)
    if isinstance(value, list):
        return "[" + ", ".join(shown(v) for v in value) + "]"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{k} = {shown(v)}" for k, v in value.items()) + "}"
    if isinstance(value, date | time):
        return value.isoformat()
    return str(value)


def strings(value: Any, key: str, problems: list[str]) -> tuple[str, ...]:
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        problems.append(f"{key}: {shown(value)} is not an array of strings")
        return ()
    return tuple(value)

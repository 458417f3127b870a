"""Untrusted text made safe to show: control characters escaped, length bounded.

Anything a container wrote (a TOML key, a file name, a reason quoting either) may
end up in a status file, a log line, a metric label or an admin's terminal. There it
must not be able to draw fake lines (newlines, escape sequences) nor grow without
bound. :func:`shown` is applied where such text enters a message; :func:`bounded`
where a list of messages leaves for the outside.
"""

from __future__ import annotations

MAX_TEXT = 256
MAX_LINES = 20
MAX_REASON = 1024


def _escape(char: str) -> str:
    code = ord(char)
    if code < 0x100:
        return f"\\x{code:02x}"
    return f"\\u{code:04x}" if code < 0x10000 else f"\\U{code:08x}"


def shown(text: object, limit: int = MAX_TEXT) -> str:
    """``text`` with non-printable characters escaped, at most about ``limit`` characters.

    A longer text keeps its head and its tail (where a reason usually says why) and
    says how much was left out in between.
    """
    raw = str(text)
    if len(raw) <= limit:
        out = _escaped(raw)
        if len(out) <= limit:
            return out
    tail = limit // 3
    head = _escaped(raw[: limit - tail])[: limit - tail]
    end = _escaped(raw[-tail:])[-tail:] if tail else ""
    return f"{head}…(+{max(len(raw) - limit, 1)} chars)…{end}"


def _escaped(raw: str) -> str:
    return "".join(c if c.isprintable() else _escape(c) for c in raw)


def bounded(lines: list[str] | tuple[str, ...], *, count: int = MAX_LINES) -> list[str]:
    """At most ``count`` messages, each :func:`shown` within :data:`MAX_REASON`."""
    out = [shown(line, MAX_REASON) for line in lines[:count]]
    if len(lines) > count:
        out.append(f"… and {len(lines) - count} more")
    return out

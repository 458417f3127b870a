"""modstage's log: one structured event per line, configured once at the entry point.

An event is a name and keyword fields (``log.error("intake.rejected", drop=..., reason=...)``).
It is written as one JSON line when the stream is not a terminal (systemd/journald, CI):
the fields, then ``event``, ``level`` and an ISO-8601 UTC ``timestamp``. On a terminal it
is one readable line. When the stream is the journal (``JOURNAL_STREAM`` names its device
and inode) every line starts with its syslog priority (``<3>`` error ... ``<7>`` debug) so
journald files it at that level.

That is all modstage asks of a logging library, so it is written here with the standard
library alone: ``modstage boot`` runs on every node's boot critical path, where a logging
package's imports cost more than the boot's own log lines. :func:`capture_logs` hands the
events to a test as dictionaries instead (``event`` and ``log_level`` plus the fields).
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
import time
import traceback
from collections.abc import Iterator, Mapping
from typing import Any, TextIO

#: Numeric levels, as the standard library's ``logging`` numbers them.
DEBUG, INFO, WARNING, ERROR, CRITICAL = 10, 20, 30, 40, 50
#: A log method's level and syslog priority (sd-daemon(3) prefixes).
METHODS: dict[str, tuple[str, int, int]] = {
    "debug": ("debug", DEBUG, 7),
    "info": ("info", INFO, 6),
    "warning": ("warning", WARNING, 4),
    "error": ("error", ERROR, 3),
    "exception": ("error", ERROR, 3),
    "critical": ("critical", CRITICAL, 2),
}


class _Sink:
    """Where events go: a stream, its rendering and the lowest level written."""

    def __init__(self, stream: TextIO | None, json: bool | None, journal: bool, level: int):
        self.stream = stream  # None: sys.stderr as it is when an event is written
        self.json = json  # None: "not a terminal", decided per event
        self.journal = journal
        self.level = level

    def write(self, method: str, fields: dict[str, Any]) -> None:
        level, number, priority = METHODS[method]
        if number < self.level:
            return
        stream = self.stream if self.stream is not None else sys.stderr
        as_json = self.json if self.json is not None else not stream.isatty()
        fields["level"] = level
        fields["timestamp"] = _now()
        line = _json_line(fields) if as_json else _console_line(fields)
        if self.journal:
            line = f"<{priority}>{line}"
        stream.write(line + "\n")
        stream.flush()


_sink = _Sink(None, None, journal=False, level=INFO)
#: The lists of the :func:`capture_logs` blocks being run, innermost last.
_captures: list[list[dict[str, Any]]] = []


class Logger:
    """A named logger, with fields bound to every event it writes."""

    __slots__ = ("bound", "name")

    def __init__(self, name: str, bound: Mapping[str, Any] | None = None) -> None:
        self.name = name
        self.bound = dict(bound or {})

    def bind(self, **fields: Any) -> Logger:
        """This logger with ``fields`` added to every event."""
        return Logger(self.name, {**self.bound, **fields})

    def debug(self, event: str, **fields: Any) -> None:
        self._emit("debug", event, fields)

    def info(self, event: str, **fields: Any) -> None:
        self._emit("info", event, fields)

    def warning(self, event: str, **fields: Any) -> None:
        self._emit("warning", event, fields)

    def error(self, event: str, **fields: Any) -> None:
        self._emit("error", event, fields)

    def critical(self, event: str, **fields: Any) -> None:
        self._emit("critical", event, fields)

    def exception(self, event: str, **fields: Any) -> None:
        """An error with the exception being handled, its traceback in ``exception``."""
        self._emit("exception", event, {**fields, "exception": traceback.format_exc().rstrip()})

    def _emit(self, method: str, event: str, fields: dict[str, Any]) -> None:
        merged = {**self.bound, **fields, "event": event}
        if _captures:
            _captures[-1].append({**merged, "log_level": METHODS[method][0]})
            return
        _sink.write(method, merged)


def get_logger(name: str) -> Logger:
    """The logger named ``name``; it writes wherever :func:`configure` last pointed."""
    return Logger(name)


def configure(
    stream: TextIO | None = None,
    *,
    json: bool | None = None,
    journal: bool | None = None,
    level: int = INFO,
) -> None:
    """Send modstage's log events to ``stream`` (stderr by default).

    ``json`` defaults to "not a terminal", ``journal`` to :func:`is_journal`.
    """
    global _sink
    stream = stream if stream is not None else sys.stderr
    if journal is None:
        journal = is_journal(stream)
    _sink = _Sink(stream, json, journal, level)


def reset() -> None:
    """Back to the defaults: stderr as it is at each event, info and above."""
    global _sink
    _sink = _Sink(None, None, journal=False, level=INFO)


@contextlib.contextmanager
def capture_logs() -> Iterator[list[dict[str, Any]]]:
    """Collect every event logged in the block, at every level, instead of writing it."""
    events: list[dict[str, Any]] = []
    _captures.append(events)
    try:
        yield events
    finally:
        _captures.remove(events)


def is_journal(stream: TextIO, environ: Mapping[str, str] | None = None) -> bool:
    """True when ``stream`` is the journal: ``JOURNAL_STREAM`` holds its ``device:inode``."""
    env = os.environ if environ is None else environ
    want = env.get("JOURNAL_STREAM", "")
    if not want:
        return False
    try:
        st = os.fstat(stream.fileno())
    except (OSError, ValueError, AttributeError):  # no descriptor: StringIO, closed
        return False
    return want == f"{st.st_dev}:{st.st_ino}"


def _now() -> str:
    """Now as ISO 8601 in UTC with microseconds, e.g. ``2026-12-02T08:23:58.966820Z``."""
    ns = time.time_ns()
    seconds, micro = divmod(ns // 1000, 1_000_000)
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(seconds)) + f".{micro:06d}Z"


def _json_line(fields: dict[str, Any]) -> str:
    """One JSON object; a value JSON cannot hold is written as its ``repr``."""
    return json.dumps(fields, default=repr)


def _console_line(fields: dict[str, Any]) -> str:
    """``timestamp [level] event key=value ...``, with a traceback on the lines after."""
    fields = dict(fields)
    head = f"{fields.pop('timestamp')} [{fields.pop('level'):<8}] {fields.pop('event')}"
    tb = fields.pop("exception", None)
    tail = " ".join(f"{key}={value!r}" for key, value in fields.items())
    line = f"{head:<50} {tail}".rstrip()
    return line if tb is None else f"{line}\n{tb}"

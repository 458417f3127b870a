"""modstage's log: structlog over the standard library's ``logging``, configured once.

An event is a name and keyword fields (``log.error("intake.rejected", drop=..., reason=...)``)
on a logger named after its part of modstage (``get_logger("modstage.boot")``). The entry
point (:func:`service.cli.main` for every host command, the intake child's ``main``) calls
:func:`configure` once; from then on modstage's events and every other library's
``logging`` records (and ``warnings``) go through the same processors to the same stream:

* the level (``level``), the logger's name (``logger``) and an ISO-8601 UTC ``timestamp``;
* one JSON object per line when the stream is not a terminal (systemd/journald, CI), the
  traceback of ``log.exception`` in ``exception``; one readable line on a terminal;
* when the stream is the journal (``JOURNAL_STREAM`` names its device and inode), the line's
  syslog priority in front (``<3>`` error ... ``<7>`` debug), which journald files it at;
* the fields bound for a span of work (:func:`preview`: ``preview=true`` on every line of
  ``boot --dry-run``), through structlog's context variables.

Tests read the events with ``structlog.testing.capture_logs()`` (given
``structlog.contextvars.merge_contextvars`` to see the bound fields).
"""

from __future__ import annotations

import contextlib
import logging
import os
import sys
from collections.abc import Iterator, Mapping
from typing import TextIO

import structlog
from structlog.stdlib import ProcessorFormatter
from structlog.typing import EventDict, Processor, WrappedLogger

DEBUG, INFO, WARNING, ERROR, CRITICAL = (
    logging.DEBUG,
    logging.INFO,
    logging.WARNING,
    logging.ERROR,
    logging.CRITICAL,
)
#: syslog priority per level (sd-daemon(3) prefixes, journald's SyslogLevelPrefix).
PRIORITY = {"critical": 2, "error": 3, "warning": 4, "info": 6, "debug": 7}

#: What every line gets, whichever library logged it.
SHARED: list[Processor] = [
    structlog.contextvars.merge_contextvars,
    structlog.stdlib.add_log_level,
    structlog.stdlib.add_logger_name,
    structlog.processors.TimeStamper(fmt="iso", utc=True),
]


def get_logger(name: str) -> structlog.stdlib.BoundLogger:
    """The logger named ``name``; it follows the configuration in force at each event."""
    return structlog.stdlib.get_logger(name)


@contextlib.contextmanager
def preview() -> Iterator[None]:
    """Every event inside, modstage's and other libraries', carries ``preview=True``: it
    tells what a run would do (``boot --dry-run``), not what was done."""
    with structlog.contextvars.bound_contextvars(preview=True):
        yield


class JournalPriority:
    """A renderer whose every line starts with its syslog priority (``<6>{...}``)."""

    def __init__(self, render: Processor) -> None:
        self.render = render

    def __call__(self, logger: WrappedLogger, method: str, event: EventDict) -> str:
        priority = PRIORITY.get(str(event.get("level", method)), 6)
        line = self.render(logger, method, event)
        return f"<{priority}>{line.decode() if isinstance(line, bytes) else line}"


class _Handler(logging.StreamHandler[TextIO]):
    """modstage's one handler on the root logger (found again and replaced by configure)."""


def configure(
    stream: TextIO | None = None,
    *,
    json: bool | None = None,
    journal: bool | None = None,
    level: int = INFO,
) -> None:
    """Send every log event, modstage's and other libraries', to ``stream`` (stderr).

    ``json`` defaults to "not a terminal", ``journal`` to :func:`is_journal`; events below
    ``level`` are dropped before they are rendered.
    """
    stream = stream if stream is not None else sys.stderr
    if json is None:
        json = not stream.isatty()
    if journal is None:
        journal = is_journal(stream)
    render: Processor = (
        structlog.processors.JSONRenderer()
        if json
        else structlog.dev.ConsoleRenderer(
            colors=stream.isatty(), exception_formatter=structlog.dev.plain_traceback
        )
    )
    if journal:
        render = JournalPriority(render)
    tail: list[Processor] = [ProcessorFormatter.remove_processors_meta]
    if json:
        tail.append(structlog.processors.format_exc_info)
    handler = _Handler(stream)
    handler.setFormatter(ProcessorFormatter(processors=[*tail, render], foreign_pre_chain=SHARED))
    root = logging.getLogger()
    for old in [h for h in root.handlers if isinstance(h, _Handler)]:
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(level)
    logging.captureWarnings(True)
    structlog.configure(
        processors=[
            structlog.stdlib.filter_by_level,
            *SHARED,
            ProcessorFormatter.wrap_for_formatter,
        ],
        logger_factory=structlog.stdlib.LoggerFactory(),
        wrapper_class=structlog.stdlib.BoundLogger,
        # not cached: a module-level logger follows a later configure() and a test's
        # capture_logs() instead of keeping the first configuration
        cache_logger_on_first_use=False,
    )


def reset() -> None:
    """Undo :func:`configure` (tests): structlog's defaults, modstage's handler removed."""
    root = logging.getLogger()
    for old in [h for h in root.handlers if isinstance(h, _Handler)]:
        root.removeHandler(old)
    root.setLevel(WARNING)
    logging.captureWarnings(False)
    structlog.reset_defaults()


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

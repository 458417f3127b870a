"""structlog, configured once at the entry point.

JSON lines when stderr is not a terminal (systemd/journald, CI), readable
console lines on a terminal. Library code only calls ``structlog.get_logger()``.
"""

from __future__ import annotations

import logging
import sys
from typing import TextIO

import structlog


def configure(
    stream: TextIO | None = None, *, json: bool | None = None, level: int = logging.INFO
) -> None:
    """Send modstage's log events to ``stream`` (stderr by default)."""
    stream = stream if stream is not None else sys.stderr
    if json is None:
        json = not stream.isatty()
    renderer: structlog.typing.Processor = (
        structlog.processors.JSONRenderer() if json else structlog.dev.ConsoleRenderer()
    )
    structlog.configure(
        processors=[
            structlog.contextvars.merge_contextvars,
            structlog.processors.add_log_level,
            structlog.processors.TimeStamper(fmt="iso", utc=True),
            renderer,
        ],
        wrapper_class=structlog.make_filtering_bound_logger(level),
        logger_factory=structlog.PrintLoggerFactory(stream),
        cache_logger_on_first_use=True,
    )

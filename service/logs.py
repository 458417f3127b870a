"""structlog, imported lean and configured once at the entry point.

JSON lines when the stream is not a terminal (systemd/journald, CI), readable
console lines on a terminal. When the stream is the journal (``JOURNAL_STREAM``
names its device and inode) every line starts with its syslog priority
(``<3>`` error ... ``<7>`` debug) so journald files it at that level.

Library code asks this module for its logger (:func:`get_logger`), so structlog
is always imported through :func:`_import_structlog`: ``modstage boot`` runs on
every node's boot critical path, and a bare ``import structlog`` pulls in rich,
pygments and attrs (pretty tracebacks for the console renderer) and asyncio (for
its async log methods), about 100 ms of imports modstage never uses.
"""

from __future__ import annotations

import importlib
import os
import sys
from collections.abc import Mapping
from types import ModuleType
from typing import Any, TextIO

#: Optional extras structlog uses when importable; modstage renders tracebacks plainly.
OPTIONAL_EXTRAS = ("rich", "better_exceptions", "colorama")
#: Imported by structlog at import time, used only inside functions modstage never calls
#: (its async log methods; the deprecated thread-local context; its standard-library
#: ``logging`` integration and the ``logging`` module, used by modstage's daemon only).
LAZY = (
    "asyncio",
    "uuid",
    "logging",
    "structlog.stdlib",
    "structlog.threadlocal",
)
#: ``logging.INFO``, without importing ``logging`` on the boot path.
INFO = 20

#: syslog priority per log method (sd-daemon(3) prefixes, journald's SyslogLevelPrefix).
PRIORITY = {
    "critical": 2,
    "exception": 3,
    "error": 3,
    "err": 3,
    "warning": 4,
    "warn": 4,
    "info": 6,
    "msg": 6,
    "debug": 7,
}


class _Deferred(ModuleType):
    """Stands in ``sys.modules`` for a module until an attribute of it is first used.

    ``importlib.util.LazyLoader`` does not help here: on 3.11 the ``import``
    statement itself reads the module's ``__spec__`` and so loads it at once.
    """

    def __getattr__(self, attr: str) -> Any:
        if sys.modules.get(self.__name__) is self:
            del sys.modules[self.__name__]
        return getattr(importlib.import_module(self.__name__), attr)


def _defer(name: str) -> None:
    """Let ``import name`` succeed now and load ``name`` when it is first used."""
    sys.modules[name] = _Deferred(name)


def _import_structlog() -> ModuleType:
    """Import structlog with its optional extras hidden and asyncio deferred.

    A ``None`` entry in ``sys.modules`` makes ``import rich`` fail, which structlog
    handles (it falls back to plain tracebacks); the entries are removed again so
    code that wants rich later still gets it. Nothing changes once structlog is in.
    """
    if "structlog" in sys.modules:
        return sys.modules["structlog"]
    hidden = [name for name in OPTIONAL_EXTRAS if name not in sys.modules]
    for name in hidden:
        sys.modules[name] = None  # type: ignore[assignment]
    for name in LAZY:
        if name not in sys.modules:
            _defer(name)
    try:
        import structlog
    finally:
        for name in hidden:
            if sys.modules.get(name, False) is None:
                del sys.modules[name]
    return structlog


structlog = _import_structlog()


def get_logger(name: str) -> Any:
    """A structlog logger named ``name``; bound lazily, configured by :func:`configure`."""
    return structlog.get_logger(name)


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


def syslog_prefixed(render: Any) -> Any:
    """Wrap a final renderer so each line starts with its ``<N>`` syslog priority."""

    def prefixed(logger: Any, method: str, event: Any) -> str:
        level = event.get("level", method)
        priority = PRIORITY.get(method, PRIORITY.get(str(level), 6))
        return f"<{priority}>{render(logger, method, event)}"

    return prefixed


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
    stream = stream if stream is not None else sys.stderr
    if json is None:
        json = not stream.isatty()
    if journal is None:
        journal = is_journal(stream)
    tail: list[Any] = (
        [structlog.processors.format_exc_info, structlog.processors.JSONRenderer()]
        if json
        else [structlog.dev.ConsoleRenderer()]  # formats exc_info itself
    )
    if journal:
        tail[-1] = syslog_prefixed(tail[-1])
    structlog.configure(
        processors=[
            structlog.contextvars.merge_contextvars,
            structlog.processors.add_log_level,
            structlog.processors.TimeStamper(fmt="iso", utc=True),
            *tail,
        ],
        wrapper_class=structlog.make_filtering_bound_logger(level),
        logger_factory=structlog.PrintLoggerFactory(stream),
        # not cached: a module-level logger then follows a later configure() (a test's
        # capture_logs, the daemon's) instead of keeping the first; a few µs per event
        cache_logger_on_first_use=False,
    )

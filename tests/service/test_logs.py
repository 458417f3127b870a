"""Logging: syslog priorities for journald, and what importing structlog drags in."""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from service import logs

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(autouse=True)
def _reset_structlog() -> object:
    yield
    logs.structlog.reset_defaults()


def emit(stream: io.StringIO, **options: object) -> list[str]:
    logs.configure(stream, level=10, **options)  # type: ignore[arg-type]
    log = logs.get_logger("test")
    log.debug("d.event", n=1)
    log.info("i.event")
    log.warning("w.event")
    log.error("e.event", reason="x")
    log.critical("c.event")
    return stream.getvalue().splitlines()


def test_journal_lines_carry_their_syslog_priority() -> None:
    """On the journal each JSON line starts with <N>: debug 7, info 6, warning 4, error 3."""
    lines = emit(io.StringIO(), json=True, journal=True)
    assert [line[:3] for line in lines] == ["<7>", "<6>", "<4>", "<3>", "<2>"]
    events = [json.loads(line[3:]) for line in lines]
    assert [e["event"] for e in events] == ["d.event", "i.event", "w.event", "e.event", "c.event"]
    assert events[3]["reason"] == "x" and events[3]["level"] == "error"


def test_exception_is_logged_at_error_priority() -> None:
    """log.exception() is an error to journald (priority 3), with the traceback in the line."""
    stream = io.StringIO()
    logs.configure(stream, json=True, journal=True)
    try:
        raise ValueError("boom")
    except ValueError:
        logs.get_logger("test").exception("x.failed")
    (line,) = stream.getvalue().splitlines()
    assert line.startswith("<3>") and "boom" in json.loads(line[3:])["exception"]


def test_plain_json_lines_have_no_prefix_off_the_journal() -> None:
    """Without the journal the lines are bare JSON (a pipe, a file, CI)."""
    lines = emit(io.StringIO(), json=True, journal=False)
    assert all(line.startswith("{") for line in lines)
    assert [json.loads(line)["level"] for line in lines][1:4] == ["info", "warning", "error"]


def test_debug_is_filtered_at_the_default_level() -> None:
    """At the default level (info) debug events are dropped before rendering."""
    stream = io.StringIO()
    logs.configure(stream, json=True, journal=True)
    logs.get_logger("t").debug("hidden")
    logs.get_logger("t").info("shown")
    assert stream.getvalue().splitlines() == [stream.getvalue().splitlines()[0]]
    assert '"shown"' in stream.getvalue() and "hidden" not in stream.getvalue()


def test_journal_is_detected_by_the_streams_device_and_inode(tmp_path: Path) -> None:
    """JOURNAL_STREAM names dev:ino; only the stream with that identity is the journal."""
    with (tmp_path / "a").open("w") as a, (tmp_path / "b").open("w") as b:
        st = os.fstat(a.fileno())
        env = {"JOURNAL_STREAM": f"{st.st_dev}:{st.st_ino}"}
        assert logs.is_journal(a, env)
        assert not logs.is_journal(b, env)
        assert not logs.is_journal(a, {})
        assert not logs.is_journal(io.StringIO(), env)


def test_configure_prefixes_when_its_stream_is_the_journal(tmp_path: Path) -> None:
    """configure() with no journal= argument looks at JOURNAL_STREAM itself."""
    path = tmp_path / "journal"
    code = (
        "import os, sys\n"
        "from service import logs\n"
        "logs.configure(sys.stderr)\n"
        "logs.get_logger('t').error('e.event')\n"
        "logs.get_logger('t').info('i.event')\n"
    )
    with path.open("w") as f:
        st = os.fstat(f.fileno())
        env = dict(os.environ, JOURNAL_STREAM=f"{st.st_dev}:{st.st_ino}")
        subprocess.run([sys.executable, "-c", code], stderr=f, env=env, cwd=ROOT, check=True)
    lines = path.read_text().splitlines()
    assert [line[:3] for line in lines] == ["<3>", "<6>"]


def test_console_renderer_still_works_without_rich() -> None:
    """On a terminal the console renderer prints readable lines (no JSON, no prefix)."""
    lines = emit(io.StringIO(), json=False, journal=False)
    assert "i.event" in lines[1] and not lines[1].startswith(("{", "<"))


PROBE = """
import sys
before = set(sys.modules)
import service.logs
log = service.logs.get_logger("probe")
new = {m for m in set(sys.modules) - before if type(sys.modules[m]).__name__ == "module"}
print(" ".join(sorted(new)))
"""


def test_importing_structlog_through_logs_leaves_its_extras_out() -> None:
    """rich, pygments, attrs, asyncio and ssl are not imported by the logging module."""
    out = subprocess.run(
        [sys.executable, "-c", PROBE], cwd=ROOT, capture_output=True, text=True, check=True
    ).stdout.split()
    loaded = {m.split(".")[0] for m in out}
    assert "structlog" in loaded
    assert not loaded & {"rich", "pygments", "attr", "asyncio", "ssl", "uuid", "colorama"}


DEFERRED = """
import service.logs, sys
assert type(sys.modules["asyncio"]).__name__ == "_Deferred"
import asyncio
async def main():
    return 42
assert asyncio.run(main()) == 42
import asyncio as again
assert again.run is asyncio.run and type(sys.modules["asyncio"]).__name__ == "module"
import uuid
assert len(str(uuid.uuid4())) == 36
import rich.console
print("ok")
"""


def test_deferred_modules_load_on_first_use() -> None:
    """asyncio and uuid, deferred for structlog, work when something does use them; rich too."""
    out = subprocess.run(
        [sys.executable, "-c", DEFERRED], cwd=ROOT, capture_output=True, text=True, check=True
    )
    assert out.stdout.strip() == "ok"


def test_only_the_logging_module_imports_structlog() -> None:
    """Every other module asks service.logs for its logger, so structlog always comes in lean."""
    offenders = [
        str(path.relative_to(ROOT))
        for path in sorted((ROOT / "service").rglob("*.py"))
        if path.name != "logs.py"
        and any(
            line.strip().startswith(("import structlog", "from structlog"))
            for line in path.read_text().splitlines()
        )
    ]
    assert offenders == []

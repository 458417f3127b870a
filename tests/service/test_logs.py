"""Logging: JSON lines, syslog priorities for journald, levels, capture, and its imports."""

from __future__ import annotations

import datetime
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
def _reset_logs() -> object:
    yield
    logs.reset()


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


def test_console_lines_are_readable_on_a_terminal() -> None:
    """On a terminal each event is one readable line (no JSON, no prefix) with its fields."""
    lines = emit(io.StringIO(), json=False, journal=False)
    assert "i.event" in lines[1] and not lines[1].startswith(("{", "<"))
    assert "[error" in lines[3] and "reason='x'" in lines[3]


def test_json_line_holds_fields_event_level_and_a_utc_timestamp() -> None:
    """A JSON line carries the bound and given fields, then event, level and timestamp
    (ISO 8601, UTC, microseconds); a value JSON cannot hold is written as its repr."""
    stream = io.StringIO()
    logs.configure(stream, json=True, journal=False)
    logs.get_logger("t").bind(bundle="nvidia").info("b.event", path=Path("/x"), n=2)
    (line,) = stream.getvalue().splitlines()
    event = json.loads(line)
    assert list(event) == ["bundle", "path", "n", "event", "level", "timestamp"]
    assert event["path"] == repr(Path("/x")) and event["n"] == 2
    stamp = datetime.datetime.strptime(event["timestamp"], "%Y-%m-%dT%H:%M:%S.%fZ")
    now = datetime.datetime.now(datetime.UTC).replace(tzinfo=None)
    assert abs((now - stamp).total_seconds()) < 60


def test_capture_logs_sees_every_level_and_writes_nothing() -> None:
    """Inside capture_logs every event (debug too) is collected as a dict with event and
    log_level, nothing reaches the stream; after the block events are written again."""
    stream = io.StringIO()
    logs.configure(stream, json=True, journal=False)
    log = logs.get_logger("t").bind(bundle="b")
    with logs.capture_logs() as captured:
        log.debug("d.event", n=1)
        log.error("e.event")
    assert captured == [
        {"bundle": "b", "n": 1, "event": "d.event", "log_level": "debug"},
        {"bundle": "b", "event": "e.event", "log_level": "error"},
    ]
    assert stream.getvalue() == ""
    log.info("after")
    assert json.loads(stream.getvalue())["event"] == "after"


def test_unconfigured_events_go_to_stderr_as_it_is_then(capsys: pytest.CaptureFixture[str]) -> None:
    """Before configure() an event is written to the current sys.stderr, info and above."""
    logs.reset()
    logs.get_logger("t").debug("hidden")
    logs.get_logger("t").warning("shown")
    err = capsys.readouterr().err
    assert "shown" in err and "hidden" not in err


PROBE = """
import sys
before = set(sys.modules)
import service.logs
service.logs.get_logger("probe").info("x")
new = {m for m in set(sys.modules) - before if type(sys.modules[m]).__name__ == "module"}
print(" ".join(sorted(new)))
"""


def test_logging_imports_only_the_standard_library() -> None:
    """Logging an event imports nothing outside the standard library (it is on the boot path)."""
    out = subprocess.run(
        [sys.executable, "-c", PROBE], cwd=ROOT, capture_output=True, text=True, check=True
    ).stdout.split()
    loaded = {m.split(".")[0] for m in out}
    assert loaded - set(sys.stdlib_module_names) == {"service"}

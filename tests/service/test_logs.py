"""The log: structlog's JSON lines with level, logger and UTC timestamp, syslog priorities for
journald, the standard library's records in the same stream, capture for tests."""

from __future__ import annotations

import datetime
import io
import json
import logging
import os
import subprocess
import sys
import warnings
from pathlib import Path

import pytest
from structlog.testing import capture_logs

from service import logs
from service.cli import main
from tests.kmod import SigningKey
from tests.service.fakes import make_host

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
    event = json.loads(line[3:])
    assert line.startswith("<3>") and event["level"] == "error"
    assert "Traceback" in event["exception"] and "boom" in event["exception"]


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
    assert len(stream.getvalue().splitlines()) == 1
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
    """On a terminal each event is one readable line (no JSON, no prefix) with its fields
    and its logger's name."""
    lines = emit(io.StringIO(), json=False, journal=False)
    assert "i.event" in lines[1] and not lines[1].startswith(("{", "<"))
    assert "[error" in lines[3] and "reason=x" in lines[3] and "test" in lines[3]


def test_json_line_holds_fields_event_level_logger_and_a_utc_timestamp() -> None:
    """A JSON line carries the bound and given fields, then event, level, the logger's name
    and timestamp (ISO 8601, UTC, microseconds); a value JSON cannot hold is its repr."""
    stream = io.StringIO()
    logs.configure(stream, json=True, journal=False)
    logs.get_logger("modstage.t").bind(bundle="nvidia").info("b.event", path=Path("/x"), n=2)
    (line,) = stream.getvalue().splitlines()
    event = json.loads(line)
    assert list(event) == ["bundle", "path", "n", "event", "level", "logger", "timestamp"]
    assert event["path"] == repr(Path("/x")) and event["n"] == 2
    assert event["logger"] == "modstage.t"
    stamp = datetime.datetime.strptime(event["timestamp"], "%Y-%m-%dT%H:%M:%S.%fZ")
    now = datetime.datetime.now(datetime.UTC).replace(tzinfo=None)
    assert abs((now - stamp).total_seconds()) < 60


def test_every_line_inside_preview_carries_the_mark_and_none_after() -> None:
    """Inside ``logs.preview()`` a modstage event, a bound logger's event and a standard
    library record each carry ``preview: true``; the same three after it do not."""
    stream = io.StringIO()
    logs.configure(stream, json=True, journal=False)

    def three() -> None:
        logs.get_logger("modstage.t").info("m.event")
        logs.get_logger("modstage.t").bind(bundle="b").error("b.event")
        logging.getLogger("watchdog.x").warning("a library's record")

    with logs.preview():
        three()
    three()
    events = [json.loads(line) for line in stream.getvalue().splitlines()]
    assert [e.get("preview") for e in events] == [True, True, True, None, None, None]


def test_standard_library_records_share_the_stream_and_its_processors() -> None:
    """A library logging through ``logging`` (watchdog, pyudev) and a ``warnings.warn`` land
    in the same stream as JSON lines with level, logger, timestamp and journal priority;
    its debug records are dropped at the configured level."""
    stream = io.StringIO()
    logs.configure(stream, json=True, journal=True)
    logging.getLogger("watchdog.observers").warning("queue %s full", "q1")
    logging.getLogger("pyudev").debug("hidden")
    with warnings.catch_warnings():
        warnings.simplefilter("always")
        warnings.warn("old api", DeprecationWarning, stacklevel=1)
    lines = stream.getvalue().splitlines()
    assert len(lines) == 2 and all(line.startswith("<4>{") for line in lines)
    first, second = (json.loads(line[3:]) for line in lines)
    assert first["event"] == "queue q1 full" and first["logger"] == "watchdog.observers"
    assert first["level"] == "warning" and first["timestamp"].endswith("Z")
    assert second["logger"] == "py.warnings" and "old api" in second["event"]


def test_configure_again_replaces_its_handler_and_keeps_others() -> None:
    """A second configure() writes only to the new stream (one line per event), and a
    handler someone else put on the root logger stays."""
    other = logging.NullHandler()
    logging.getLogger().addHandler(other)
    try:
        first, second = io.StringIO(), io.StringIO()
        logs.configure(first, json=True, journal=False)
        logs.configure(second, json=True, journal=False)
        logs.get_logger("t").info("once")
        assert first.getvalue() == "" and len(second.getvalue().splitlines()) == 1
        assert other in logging.getLogger().handlers
    finally:
        logging.getLogger().removeHandler(other)


def test_capture_logs_sees_every_level_and_writes_nothing() -> None:
    """Inside structlog's capture_logs every event (debug too) is collected as a dict with
    event and log_level, nothing reaches the stream; after the block events are written."""
    stream = io.StringIO()
    logs.configure(stream, json=True, journal=False)
    log = logs.get_logger("t").bind(bundle="b")
    with capture_logs() as captured:
        log.debug("d.event", n=1)
        log.error("e.event")
    assert captured == [
        {"bundle": "b", "n": 1, "event": "d.event", "log_level": "debug"},
        {"bundle": "b", "event": "e.event", "log_level": "error"},
    ]
    assert stream.getvalue() == ""
    log.info("after")
    assert json.loads(stream.getvalue())["event"] == "after"


def test_a_host_command_logs_to_stderr_and_never_to_its_output(
    tmp_path: Path, kernel: str, rsa_key: SigningKey
) -> None:
    """main() configures the log for a host command: an event (here boot's ``config.invalid``)
    is a JSON line on stderr; the command's own output stays free of it."""
    layout = make_host(tmp_path / "root", kernel, rsa_key.cert_pem)
    layout.config.write_text("no_such_key = 1\n")
    root = layout.root
    out = io.StringIO()
    err = io.StringIO()
    saved = sys.stderr
    sys.stderr = err
    try:
        main(["boot", "--root", str(root)], out)
    finally:
        sys.stderr = saved
    events = [json.loads(line) for line in err.getvalue().splitlines()]
    assert any(e["event"] == "config.invalid" and e["logger"] == "modstage.boot" for e in events)
    assert "config.invalid" not in out.getvalue()


PROBE = """
import sys
before = set(sys.modules)
import service.logs
service.logs.configure()
service.logs.get_logger("probe").info("x")
new = {m for m in set(sys.modules) - before if type(sys.modules[m]).__name__ == "module"}
print(" ".join(sorted(new)))
"""


def test_logging_imports_structlog_and_the_standard_library_only() -> None:
    """Logging an event imports structlog (paid honestly: no placeholder modules) and, beyond
    the standard library, only what structlog itself pulls in when it is installed (rich,
    and through it pygments and attrs; colorama: structlog.dev imports them if importable)."""
    out = subprocess.run(
        [sys.executable, "-c", PROBE], cwd=ROOT, capture_output=True, text=True, check=True
    ).stdout.split()
    loaded = {m.split(".")[0] for m in out}
    assert {"structlog", "logging"} <= loaded
    assert loaded - set(sys.stdlib_module_names) <= {
        "service",
        "structlog",
        "rich",
        "pygments",
        "attr",
        "colorama",
    }

"""A host without a time zone database (no tzdata: slim images) still runs the shipped
config, whose reboot window is in UTC; any other zone is a config error that says what is
missing, and ``modstage serve`` exits 78 on it, which its unit does not restart."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from service.layout import Layout

REPO = Path(__file__).resolve().parents[2]
WITHOUT_TZDATA = """
import sys, zoneinfo
sys.modules["tzdata"] = None  # nor the PyPI package zoneinfo falls back to
zoneinfo.reset_tzpath(to=[])
sys.path.insert(0, {repo!r})
from datetime import UTC, datetime
from pathlib import Path
from service.config import Config
path = Path({config!r})
for zone in ("UTC", "Europe/Berlin"):
    path.write_text(
        '[reboot]\\nbackend = "none"\\ndays = ["mon"]\\nstart = "02:00"\\nend = "03:00"\\n'
        f'timezone = "{{zone}}"\\n'
    )
    try:
        window = Config.load(path).reboot.window
        print(zone, "opens", window.next_open(datetime(2026, 12, 6, tzinfo=UTC)).isoformat())
    except Exception as exc:
        print(zone, type(exc).__name__, exc)
"""


def test_utc_needs_no_time_zone_database(tmp_path: Path) -> None:
    """With no tz database at all, a UTC window loads and opens on Monday 02:00 UTC; another
    zone is refused, naming the missing database."""
    script = WITHOUT_TZDATA.format(repo=str(REPO), config=str(tmp_path / "config.toml"))
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    utc, berlin = done.stdout.splitlines()
    assert utc == "UTC opens 2026-12-07T02:00:00+00:00"
    assert berlin.startswith("Europe/Berlin ConfigError ")
    assert berlin.endswith(
        "reboot.timezone: 'Europe/Berlin' is not a known time zone "
        "(no time zone database: is tzdata installed?)"
    )


def test_serve_exits_78_on_an_invalid_config(host: Layout, tmp_path: Path) -> None:
    """``modstage serve`` on a config.toml it refuses exits 78 (EX_CONFIG), the status the
    daemon's unit names in ``RestartPreventExitStatus=`` (so it is not restarted every 5 s);
    the message names the file and the key."""
    host.config.parent.mkdir(parents=True, exist_ok=True)
    host.config.write_text('[reboot]\ntimezone = "Mars/Olympus"\n')
    done = subprocess.run(
        [sys.executable, "-m", "service.cli", "serve", "--root", str(host.root)],
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=60,
    )
    assert done.returncode == 78, done.stderr
    assert f"{host.config}: reboot.timezone: 'Mars/Olympus' is not a known time zone" in done.stderr
    unit = (REPO / "deploy/systemd/modstage.service").read_text().splitlines()
    assert "RestartPreventExitStatus=78" in unit and "Restart=on-failure" in unit

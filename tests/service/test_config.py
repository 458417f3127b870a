"""``config check``'s value problems: each names the key's path and the whole value given."""

from __future__ import annotations

import io
import json
from pathlib import Path

import pytest

from service.cli import main
from service.config import Config
from service.layout import Layout


def problems(tmp_path: Path, text: str) -> list[str]:
    """The config file's problems as ``modstage config check --json`` reports them, each
    without the file name it starts with (the trust directory's are left out)."""
    layout = Layout(tmp_path)
    layout.config.parent.mkdir(parents=True, exist_ok=True)
    layout.config.write_text(text, encoding="utf-8")
    out = io.StringIO()
    assert main(["config", "check", "--root", str(tmp_path), "--json"], out) == 1
    head = f"{layout.config}: "
    return [p.removeprefix(head) for p in json.loads(out.getvalue())["problems"] if head in p]


def test_a_bad_day_is_named_whole(tmp_path: Path) -> None:
    """``days = ["funday"]`` is named as given (not its first three letters), with the
    days there are; a word that merely starts like a day is no day either."""
    found = problems(tmp_path, '[reboot]\ndays = ["funday", "monkey", "Mon"]\n')
    assert found == [
        "reboot.days: 'funday' is not a day (sun..sat)",
        "reboot.days: 'monkey' is not a day (sun..sat)",
    ]


def test_a_day_may_be_short_or_whole_in_any_case() -> None:
    """``Mon``, ``monday`` and ``SUNDAY`` name days, kept as their three-letter names."""
    config = Config.from_dict({"reboot": {"days": ["Mon", "monday", "SUNDAY"]}})
    assert config.reboot.window.days == ("mon", "mon", "sun")


# (config.toml, the key's path, the value as the file spells it)
BAD = [
    ("retain = 0", "retain", "0"),
    ('max_boot_attempts = "three"', "max_boot_attempts", "'three'"),
    ('allowed_bundles = ["nvidia", 3]', "allowed_bundles[1]", "3"),
    ('allowed_memory_policies = ["sometimes"]', "allowed_memory_policies[0]", "'sometimes'"),
    ('forbidden_params = "NVreg_X"', "forbidden_params", "'NVreg_X'"),
    ('allow_foreign_firmware_path = "yes"', "allow_foreign_firmware_path", "'yes'"),
    ('require_symbol_crcs = "no"', "require_symbol_crcs", "'no'"),
    ('hotplug_policy = "auto"', "hotplug_policy", "'auto'"),
    ("incoming_dirs = []", "incoming_dirs", "[]"),
    ('incoming_dirs = ["run/x"]', "incoming_dirs", "'run/x'"),
    ("limits = 3", "limits", "3"),
    ("[limits]\nmax_files = 0", "limits.max_files", "0"),
    ("[limits]\nmax_seconds = 1.5", "limits.max_seconds", "1.5"),
    ('[node_labels]\nenabled = "yes"', "node_labels.enabled", "'yes'"),
    ('[node_labels]\nprefix = "gpu.k8s.io"', "node_labels.prefix", "'gpu.k8s.io'"),
    ('reboot = "kured"', "reboot", "'kured'"),
    ('[reboot]\nbackend = "reboot-now"', "reboot.backend", "'reboot-now'"),
    ('[reboot]\ncommand = "reboot -f"', "reboot.command", "'reboot -f'"),
    ('[reboot]\ndays = "mon"', "reboot.days", "'mon'"),
    ('[reboot]\nstart = "25:00"', "reboot.start", "'25:00'"),
    ("[reboot]\nend = 05:00:00", "reboot.end", "05:00:00"),
    ('[reboot]\ntimezone = "Mars/Olympus"', "reboot.timezone", "'Mars/Olympus'"),
    ("[reboot]\nmin_delay = -1", "reboot.min_delay", "-1"),
    ("[reboot]\nmin_interval = true", "reboot.min_interval", "true"),
    ('[reboot]\nupgrading_bound = "4h"', "reboot.upgrading_bound", "'4h'"),
    ("[reboot]\nsentinel = 1", "reboot.sentinel", "1"),
    ("publish = []", "publish", "[]"),
    ('[publish]\nstatus_dirs = "/run/x"', "publish.status_dirs", "'/run/x'"),
    ('[publish]\nstatus_dirs = ["run/x"]', "publish.status_dirs", "'run/x'"),
    ('[publish]\ndigest_files = ["/x"]', "publish.digest_files", "['/x']"),
    ("[publish]\ndigest_files = {nvidia = 3}", "publish.digest_files.nvidia", "3"),
    ('[publish]\ndigest_files = {nvidia = "x"}', "publish.digest_files.nvidia", "'x'"),
]


@pytest.mark.parametrize(("text", "key", "value"), BAD, ids=[b[1] for b in BAD])
def test_every_value_problem_names_its_key_and_whole_value(
    tmp_path: Path, text: str, key: str, value: str
) -> None:
    """A bad value is one problem on one line: ``<key path>: <the value as written> ...``
    (a TOML value the way the file spells it: ``true``, ``[]``, a time unquoted)."""
    found = problems(tmp_path, text + "\n")
    assert len(found) == 1, found
    assert found[0].startswith(f"{key}: {value} "), found[0]
    assert "\n" not in found[0]

"""The boot path never loads less than the last known good: corrupt state, invalid config."""

from __future__ import annotations

import io
import json
import subprocess
import sys
from pathlib import Path

from structlog.testing import capture_logs

from service.bundles.phase import Phase
from service.bundles.state import State
from service.bundles.statefile import LAST_GOOD, load, save
from service.cli import main
from service.config import Config
from service.layout import Layout
from tests.hosts import running_host
from tests.service.fakes import FakeKernel
from tests.service.fakes import boot_with as _boot
from tests.service.fakes import pending as _pending


def test_corrupt_state_boots_the_last_known_good_from_the_store(
    host: Layout, signed: dict[str, Path], kernel: str
) -> None:
    """state.json garbled after v1 went active and v2 failed: the next boot loads v1 again."""
    good = _pending(host, kernel, [(signed["ms_exporter"], "")])
    _boot(host, FakeKernel()).run()
    assert json.loads((host.var / LAST_GOOD).read_text())["test"]["generation"] == good
    host.state.write_text('{"format": 1, "bundles": {"test": ')  # torn by a bad disk
    fake = FakeKernel()
    with capture_logs() as logs:
        state = _boot(host, fake).run()
    assert fake.calls == [("load", "ms_exporter", "")]
    b = state.bundle("test")
    assert (b.phase, b.active) == (Phase.ACTIVE, good)
    assert "rebuilt from the store" in b.history[0].note
    rebuilt = [e for e in logs if e["event"] == "state.rebuilt"]
    assert rebuilt and rebuilt[0]["log_level"] == "error" and "corrupt-" in rebuilt[0]["aside"]
    assert load(host.state).bundle("test").active == good  # later boots start from it
    assert list(host.var.glob("state.json.corrupt-*"))  # kept for the admin


def test_without_a_pointer_stored_generations_are_remembered_not_loaded(
    host: Layout, signed: dict[str, Path], kernel: str
) -> None:
    """No last-good pointer: nothing is guessed, but the admin can roll back to a stored one."""
    gen = _pending(host, kernel, [(signed["ms_exporter"], "")])
    (host.var / LAST_GOOD).unlink(missing_ok=True)
    host.state.write_text("garbage")
    fake = FakeKernel()
    b = _boot(host, fake).run().bundle("test")
    assert fake.calls == [] and b.active is None and gen in b.generations
    assert "modstage rollback" in b.history[0].note
    out = io.StringIO()
    assert main(["rollback", "--root", str(host.root), "test", gen[:12]], out) == 0
    assert _boot(host, FakeKernel()).run().bundle("test").active == gen


def test_a_config_typo_boots_with_defaults_and_logs_an_error(
    host: Layout, signed: dict[str, Path], kernel: str
) -> None:
    """``max_boot_attempt = 3`` (a typo): boot still loads, the rest of the config applies."""
    gen = _pending(host, kernel, [(signed["ms_exporter"], "")])
    host.etc.mkdir(parents=True, exist_ok=True)
    host.config.write_text("max_boot_attempt = 3\nallow_foreign_firmware_path = true\n")
    config, problems = Config.salvage(host.config)
    assert problems == ("max_boot_attempt: unknown key",)
    assert config == Config(allow_foreign_firmware_path=True)
    fake = FakeKernel()
    assert _boot(host, fake, **vars_of(config)).run().bundle("test").active == gen


def vars_of(config: Config) -> dict[str, object]:
    """The config's fields as keyword arguments."""
    return {k: getattr(config, k) for k in config.__dataclass_fields__}


def test_boot_command_goes_on_with_an_invalid_config(tmp_path: Path) -> None:
    """``modstage boot`` with a broken config exits 0 (nothing to load) and says so on stderr;
    a metrics file it cannot remove is never printed to stdout. (Run as a process: boot
    configures logging for the whole process.)"""
    layout = running_host(tmp_path, "6.1.0-test", "b1")
    layout.etc.mkdir(parents=True)
    layout.config.write_text("max_boot_attempt = 3\n")
    layout.trusted.mkdir()
    save(layout.state, State())
    layout.metrics.mkdir(parents=True)  # "Is a directory"
    done = subprocess.run(
        [sys.executable, "-m", "service.cli", "boot", "--root", str(tmp_path)],
        capture_output=True,
        text=True,
        check=False,
        cwd=Path(__file__).resolve().parents[2],
    )
    assert done.returncode == 0, done.stderr
    assert "metrics" not in done.stdout
    assert "config.invalid" in done.stderr and "max_boot_attempt" in done.stderr
    assert "metrics.retire_failed" in done.stderr


def test_the_daemon_rebuilds_a_state_it_finds_corrupt(
    host: Layout, signed: dict[str, Path], kernel: str
) -> None:
    """A daemon step that finds state.json corrupt sets it aside and rebuilds it at once, so
    no later boot finds it missing; the last known good stays active."""
    from service.rebooting.request import NoRebooter
    from tests.service.test_daemon import _daemon

    good = _pending(host, kernel, [(signed["ms_exporter"], "")])
    _boot(host, FakeKernel()).run()
    host.state.write_text("{")
    daemon = _daemon(host, NoRebooter())
    with capture_logs() as logs:
        assert daemon._guarded(daemon.maybe_reboot) is None
    assert [e["event"] for e in logs] == ["daemon.step_failed", "state.rebuilt"]
    assert load(host.state).bundle("test").active == good
    assert list(host.var.glob("state.json.corrupt-*"))

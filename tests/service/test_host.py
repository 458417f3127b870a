"""``Host``: what every entry point builds, built once, lazily, the same way."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from service.cmd.host import Host
from service.config import RebootConfig
from service.errors import ConfigError, TrustError
from service.host.recording import RecordingKernel
from service.intake.scan import Intake
from service.layout import Layout
from service.rebooting.request import KuredSentinel, NoRebooter
from tests.service.fakes import FakeKernel

ROOT = Path(__file__).resolve().parents[2]


def test_each_part_is_built_once_from_the_layout(host: Layout) -> None:
    """Asked twice, a part is the same object; intake gets the host's config and trust."""
    built = Host(host)
    assert built.trust is built.trust and built.config is built.config
    assert [k.subject for k in built.trust.keys] and built.config_problems == ()
    assert isinstance(built.kernel, RecordingKernel)  # a temporary root is a sandbox
    assert built.kernel is built.kernel
    assert isinstance(built.intake, Intake) and built.intake is built.intake
    assert built.intake.config is built.config and built.intake.trust is built.trust
    assert isinstance(built.rebooter, NoRebooter)


def test_a_given_kernel_replaces_the_chosen_one(host: Layout) -> None:
    """The crash-test runner's fake kernel is the one the host hands out."""
    fake = FakeKernel()
    assert Host(host, fake).kernel is fake


def test_the_configured_rebooter_is_built(host: Layout) -> None:
    """``reboot.backend = "kured"`` in config.toml gives the kured sentinel backend."""
    host.config.parent.mkdir(parents=True, exist_ok=True)
    host.config.write_text('[reboot]\nbackend = "kured"\n')
    assert isinstance(Host(host).rebooter, KuredSentinel)


def test_an_invalid_config_is_refused_or_salvaged_and_read_only_when_used(host: Layout) -> None:
    """A typo fails only the parts that need the config; salvaging names the problem."""
    host.config.parent.mkdir(parents=True, exist_ok=True)
    host.config.write_text("retain = -1\nmax_boot_attempts = 2\n")
    strict = Host(host)
    assert strict.trust.keys  # verify and the like never read config.toml
    with pytest.raises(ConfigError, match="retain"):
        _ = strict.config
    with pytest.raises(ConfigError):
        _ = strict.intake
    salvaged = Host(host, salvage=True)
    assert salvaged.config.max_boot_attempts == 2
    assert salvaged.config_problems and "retain" in salvaged.config_problems[0]


def test_the_boot_neither_reads_nor_judges_the_reboot_table(host: Layout) -> None:
    """Salvaging (the boot's read) leaves ``[reboot]`` to the daemon: a bad reboot table is
    no problem for the boot and its reboot policy is the default; the strict read refuses it."""
    host.config.parent.mkdir(parents=True, exist_ok=True)
    host.config.write_text(
        'max_boot_attempts = 2\n[reboot]\nbackend = "kured"\ntimezone = "Mars/Base"\n'
    )
    salvaged = Host(host, salvage=True)
    assert salvaged.config.max_boot_attempts == 2 and salvaged.config_problems == ()
    assert salvaged.config.reboot == RebootConfig()
    with pytest.raises(ConfigError, match="Mars/Base"):
        _ = Host(host).config


def test_another_trust_directory_and_strict_trust(host: Layout, tmp_path: Path) -> None:
    """``trusted`` replaces trusted.d; ``strict_trust`` refuses an unusable certificate."""
    other = tmp_path / "other"
    other.mkdir()
    (other / "junk.pem").write_text("not a certificate\n")
    assert Host(host, trusted=other).trust.keys == ()
    with pytest.raises(TrustError, match=r"junk\.pem"):
        _ = Host(host, trusted=other, strict_trust=True).trust


def test_the_boot_parts_import_no_reboot_backend_nor_intake(host: Layout) -> None:
    """Config, trust and kernel (what ``modstage boot`` takes) leave the rest unimported."""
    probe = (
        "import sys; from pathlib import Path; from service.cmd.host import Host;"
        "from service.layout import Layout; h = Host(Layout(Path(sys.argv[1])));"
        "h.config, h.trust, h.kernel;"
        "print(sorted(m for m in ('service.rebooting.request', 'service.intake.scan',"
        " 'service.verify.signature.keyring') if m in sys.modules))"
    )
    out = subprocess.run(
        [sys.executable, "-c", probe, str(host.root)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert out.strip() == "[]"

"""``modstage wait`` refuses what it cannot act on, and ends on a generation for another kernel
or one whose devices were absent at boot."""

from __future__ import annotations

import io
from pathlib import Path

import pytest

from service.bundles.phase import Phase
from service.bundles.state import Generation
from service.cli import main
from service.layout import Layout
from service.publish.bundle_status import write_status
from stager.wait import (
    EXIT_NO_DEVICE,
    EXIT_OTHER_KERNEL,
    EXIT_USAGE,
    MISSING_GRACE,
    StatusReader,
    WaitUsage,
)
from tests.hosts import running_host
from tests.stager.test_wait import GEN, KERNEL, OLD, active, loading, pending


def wait(status_dir: Path, *extra: str) -> tuple[int, str]:
    """Run ``modstage wait --bundle nvidia`` with ``extra``; (exit code, stdout)."""
    out = io.StringIO()
    code = main(["wait", "--status-dir", str(status_dir), "--bundle", "nvidia", *extra], out)
    return code, out.getvalue()


@pytest.mark.parametrize(
    ("extra", "words"),
    [
        (["--timeout", "-1"], "--timeout must be 0 or more"),
        (["--interval", "0"], "--interval must be more than 0"),
        (["--generation", "deadbeef!"], "is not a generation id"),
        (["--generation", "dead"], "is not a generation id"),
    ],
)
def test_bad_option_values_exit_2(
    tmp_path: Path, extra: list[str], words: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """Values wait cannot act on are refused at once (exit 2), saying which and why."""
    assert wait(tmp_path, *extra)[0] == EXIT_USAGE
    assert words in capsys.readouterr().err


def test_a_missing_status_directory_is_given_up_on(tmp_path: Path) -> None:
    """``--status-dir /nonexistent`` does not wait forever: past the grace, a usage error
    naming the directory; a directory that appears in time is read."""
    now = [0.0]
    reader = StatusReader(Layout(tmp_path).status / "nvidia.json", grace=60.0, clock=lambda: now[0])
    assert reader() is None
    now[0] = 59.0
    assert reader() is None
    now[0] = 60.0
    with pytest.raises(WaitUsage, match=r"status directory .*/status still does not exist"):
        reader()
    write_status(Layout(tmp_path), "nvidia", active(), generation=GEN)
    assert reader() is not None and reader.missing_since is None


def test_the_cli_says_the_status_directory_is_missing(tmp_path: Path) -> None:
    """The first line says the directory does not exist yet and when wait gives up."""
    code, out = wait(tmp_path / "nonexistent", "--timeout", "0")
    assert code == 3
    assert out.startswith(f"nvidia: status directory {tmp_path / 'nonexistent'} does not exist")
    assert MISSING_GRACE == 60.0


def test_an_unknown_generation_is_not_called_pending(tmp_path: Path) -> None:
    """A generation the status file does not name is 'not known to the host yet'."""
    layout = Layout(tmp_path)
    write_status(layout, "nvidia", pending())
    code, out = wait(layout.status, "--generation", "deadbeef", "--timeout", "0")
    assert code == 3 and "generation deadbeef is not known to the host yet" in out
    assert "pending (generation deadbeef" not in out


def test_a_prefix_of_the_pending_generation_is_followed(tmp_path: Path) -> None:
    """A unique prefix stands for the full id."""
    layout = Layout(tmp_path)
    write_status(layout, "nvidia", active(), generation=GEN)
    assert wait(layout.status, "--generation", GEN[:12])[0] == 0


def test_a_generation_for_another_kernel_ends_with_exit_4(tmp_path: Path) -> None:
    """Pending for kernel X while Y runs: 'waiting for kernel X (running Y)', exit 4."""
    layout = running_host(tmp_path, KERNEL, boot_id=None)
    b = pending()
    b = b.with_generation(Generation(GEN, "2", "6.2.0-next", added=2.0))
    assert b.phase is Phase.PENDING
    write_status(layout, "nvidia", b)
    code, out = wait(layout.status, "--generation", GEN)
    assert code == EXIT_OTHER_KERNEL
    assert out == f"nvidia: waiting for kernel 6.2.0-next (running {KERNEL})\n"


def test_a_generation_whose_devices_were_absent_at_boot_ends_with_exit_5(tmp_path: Path) -> None:
    """The boot found no device for the pending generation (no_device: nothing failed, it
    stays pending): wait ends at once with exit 5 and the boot's reason, for the pending
    generation and for an active one the boot found no device for; another generation
    than the one the boot tried is not concerned."""
    layout = Layout(tmp_path)
    reason = "nvidia: no device was present at boot (ENODEV)"
    absent = loading().move(Phase.NO_DEVICE, loaded=(), note=reason)
    write_status(layout, "nvidia", absent, errors=[reason], generation=GEN)
    code, out = wait(layout.status, "--generation", GEN, "--timeout", "0")
    assert code == EXIT_NO_DEVICE
    assert (
        out == f"nvidia: generation {GEN[:12]} was not loaded: {reason}; it loads at a boot "
        "with the device present\n"
    )
    code, out = wait(layout.status, "--generation", OLD, "--timeout", "0")
    assert code != EXIT_NO_DEVICE and "was not loaded" not in out
    again = active().move(Phase.LOADING).move(Phase.NO_DEVICE, loaded=(), note=reason)
    write_status(layout, "nvidia", again, errors=[reason], generation=GEN)
    assert wait(layout.status, "--generation", GEN, "--timeout", "0")[0] == EXIT_NO_DEVICE


def test_an_unwritable_ready_file_is_a_clear_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The generation went active but the ready file cannot be written: exit 1, no traceback."""
    layout = Layout(tmp_path)
    write_status(layout, "nvidia", active(), generation=GEN)
    blocker = tmp_path / "not-a-dir"
    blocker.write_text("")
    code, _out = wait(layout.status, "--generation", GEN, "--ready-file", str(blocker / "ready"))
    err = capsys.readouterr().err
    assert code == 1 and "the generation is active, but the ready file" in err
    assert "Traceback" not in err

"""``modstage wait`` refuses what it cannot act on, and ends on a generation for another kernel."""

from __future__ import annotations

import io
from pathlib import Path

import pytest

from service.cli import main
from service.layout import Layout
from service.store.state import Generation, Phase
from service.store.statusfile import write_status
from stager.wait import EXIT_OTHER_KERNEL, EXIT_USAGE
from tests.stager.test_wait import GEN, KERNEL, active, pending


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


def test_a_missing_status_directory_exits_2_at_once(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """``--status-dir /nonexistent`` does not wait forever: exit 2 naming the directory."""
    assert wait(tmp_path / "nonexistent")[0] == EXIT_USAGE
    assert f"status directory {tmp_path / 'nonexistent'} does not exist" in capsys.readouterr().err


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
    layout = Layout(tmp_path)
    layout.os_release.parent.mkdir(parents=True)
    layout.os_release.write_text(KERNEL + "\n")
    b = pending()
    b = b.with_generation(Generation(GEN, "2", "6.2.0-next", added=2.0))
    assert b.phase is Phase.PENDING
    write_status(layout, "nvidia", b)
    code, out = wait(layout.status, "--generation", GEN)
    assert code == EXIT_OTHER_KERNEL
    assert out == f"nvidia: waiting for kernel 6.2.0-next (running {KERNEL})\n"


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

"""Every host command refuses a ``--root`` it cannot act on, and ends in a message, never a
traceback, when a file of the root is missing; usage errors exit 2 as ``--help`` says."""

from __future__ import annotations

import io
from pathlib import Path

import pytest

from service.cli import main
from service.layout import Layout

VERBS = [
    ["status"],
    ["status", "--json"],
    ["generations"],
    ["prune"],
    ["hold", "nvidia"],
    ["release", "nvidia"],
    ["retry", "nvidia"],
    ["rollback", "nvidia"],
    ["boot"],
    ["boot", "--dry-run"],
    ["intake"],
    ["config", "check"],
    ["verify", "m.ko"],
]


def _files(root: Path) -> list[Path]:
    return sorted(root.rglob("*")) if root.exists() else []


@pytest.mark.parametrize("argv", VERBS, ids=" ".join)
def test_a_root_that_does_not_exist_is_refused_and_not_created(
    argv: list[str], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A typo'd ``--root`` exits 2 naming it; nothing (no ``var/lib/modstage/.lock``) is
    created under it, and ``status`` does not call it healthy."""
    root = tmp_path / "typo"
    assert main([*argv, "--root", str(root)], io.StringIO()) == 2
    assert f"--root {root} does not exist" in capsys.readouterr().err
    assert not root.exists()


@pytest.mark.parametrize("argv", VERBS, ids=" ".join)
def test_a_root_that_is_not_a_modstage_host_is_refused(
    argv: list[str], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """An existing directory holding neither etc/modstage nor var/lib/modstage (``EMPTY``)
    exits 2 saying so, and stays empty."""
    root = tmp_path / "EMPTY"
    root.mkdir()
    assert main([*argv, "--root", str(root)], io.StringIO()) == 2
    err = capsys.readouterr().err
    assert "is not a modstage host or sandbox" in err
    assert f"modstage sandbox {root} --kernel RELEASE --trust CERT lays one out" in err
    assert _files(root) == []


def test_a_missing_osrelease_is_a_message_not_a_traceback(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """``boot`` on a sandbox without ``proc/sys/kernel/osrelease`` exits 1 naming the file."""
    layout = Layout(tmp_path)
    layout.etc.mkdir(parents=True)
    assert main(["boot", "--root", str(tmp_path)], io.StringIO()) == 1
    err = capsys.readouterr().err
    assert "osrelease" in err and "Traceback" not in err


@pytest.mark.parametrize(
    "argv",
    [["prune", "--keep", "-1"], ["generations", "amd"]],
    ids=" ".join,
)
def test_usage_errors_and_unknown_bundles_exit_2(
    argv: list[str], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """``prune --keep -1`` and ``generations`` of a bundle nobody staged exit 2 (usage), as
    the docs and ``--help`` say."""
    Layout(tmp_path).var.mkdir(parents=True)
    assert main([*argv, "--root", str(tmp_path)], io.StringIO()) == 2
    assert "error:" in capsys.readouterr().err


def test_stage_without_a_module_is_a_usage_error(tmp_path: Path) -> None:
    """``stage`` with no ``--module`` exits 2 (argparse names the missing option)."""
    argv = ["stage", "--into", str(tmp_path), "--bundle", "b", "--version", "1", "--kernel", "k"]
    with pytest.raises(SystemExit) as exited:
        main(argv, io.StringIO())
    assert exited.value.code == 2

"""A subcommand's stray argument is that subcommand's usage error: its own usage line and
``modstage COMMAND: error: …``, exit 2, never the top-level usage."""

from __future__ import annotations

import io

import pytest

from service.cli import main

STRAYS = [
    (["boot", "--dry-run", "--json"], "modstage boot", "--json"),
    (["status", "nosuch"], "modstage status", "nosuch"),
    (["generations", "nvidia", "extra"], "modstage generations", "extra"),
    (["config", "check", "nosuch"], "modstage config check", "nosuch"),
]


@pytest.mark.parametrize(("argv", "prog", "stray"), STRAYS, ids=[" ".join(s[0]) for s in STRAYS])
def test_a_stray_argument_is_reported_by_its_subcommand(
    capsys: pytest.CaptureFixture[str], argv: list[str], prog: str, stray: str
) -> None:
    """Exit 2; the usage printed is the subcommand's, and so is the error line naming the
    argument it does not know."""
    with pytest.raises(SystemExit) as stop:
        main(argv, io.StringIO())
    err = capsys.readouterr().err.splitlines()
    assert stop.value.code == 2
    assert err[0].startswith(f"usage: {prog} [-h]"), err
    assert err[-1] == f"{prog}: error: unrecognized arguments: {stray}", err


def test_a_stray_argument_before_the_command_is_the_top_levels(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """An option no parser knows, given before the command, stays modstage's own error."""
    with pytest.raises(SystemExit) as stop:
        main(["--bogus", "status"], io.StringIO())
    err = capsys.readouterr().err.splitlines()
    assert stop.value.code == 2
    assert err[0].startswith("usage: modstage [-h]")
    assert err[-1] == "modstage: error: unrecognized arguments: --bogus"

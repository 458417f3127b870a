"""The `modstage` command line: one command's parser, and the boot unit's line read without one."""

from __future__ import annotations

import argparse

import pytest

from service.parser import VERBS, build_parser

COMMANDS = [n for n, v in VERBS.items() if v.parent is None]


def _subparser(parser: argparse.ArgumentParser, name: str) -> argparse.ArgumentParser:
    (sub,) = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    found: argparse.ArgumentParser = sub.choices[name]
    return found


@pytest.mark.parametrize("name", sorted(COMMANDS))
def test_one_command_parser_equals_the_whole_parsers(name: str) -> None:
    """Each command's help (options, defaults, exit codes) is the same from either parser."""
    alone = _subparser(build_parser(name), name).format_help()
    assert alone == _subparser(build_parser(), name).format_help()


def test_every_command_has_a_row() -> None:
    """The whole parser's commands are exactly the verb table's commands, in --help order."""
    (sub,) = [a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction)]
    assert list(sub.choices) == list(COMMANDS)


@pytest.mark.parametrize(
    "argv",
    [
        ["boot", "--root", "/r", "--dry-run"],
        ["status", "--reboot-required"],
        ["retry", "nvidia", "abc"],
        ["config", "check", "--json"],
        [
            "stage",
            "--bundle",
            "b",
            "--version",
            "1",
            "--kernel",
            "k",
            "--into",
            "/d",
            "--module",
            "m.ko",
        ],
    ],
)
def test_one_command_parser_gives_the_same_namespace(argv: list[str]) -> None:
    """Parsing a command line with its command's parser alone gives the whole parser's result."""
    assert build_parser(argv[0]).parse_args(argv) == build_parser().parse_args(argv)


def _every_subcommand(
    parser: argparse.ArgumentParser, path: tuple[str, ...] = ()
) -> list[tuple[tuple[str, ...], argparse.ArgumentParser]]:
    """Each subcommand's words (``("config", "check")``) and parser, recursively."""
    found = []
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                found += [((*path, name), sub), *_every_subcommand(sub, (*path, name))]
    return found


@pytest.mark.parametrize("words", [w for w, _ in _every_subcommand(build_parser())], ids=" ".join)
def test_every_help_has_a_worked_example_of_its_own_command(words: tuple[str, ...]) -> None:
    """Each subcommand's --help has an ``example:`` section, after its arguments, whose
    first line is a ``modstage`` command line naming that subcommand (``modstage config
    check`` for ``check``), kept as written rather than refilled."""
    (parser,) = [p for w, p in _every_subcommand(build_parser()) if w == words]
    help_text = parser.format_help()
    assert "\nexample:\n" in help_text, help_text
    after = help_text.split("\nexample:\n", 1)[1]
    first = after.splitlines()[0]
    assert first.startswith("  modstage "), first
    assert first.split()[1 : 1 + len(words)] == list(words), first
    assert help_text.index("\nexample:\n") > help_text.index("options:")


def test_the_help_names_each_argument() -> None:
    """``BUNDLE`` and ``GEN`` are explained (``GEN`` differently for retry and rollback),
    wait names its default status directory, and verify says how FILEs and DIRs are
    judged."""
    helps = {w: p.format_help() for w, p in _every_subcommand(build_parser())}
    for verb in ("retry", "rollback", "hold", "release", "forget"):
        assert "BUNDLE         the bundle (slot) name" in helps[(verb,)], helps[(verb,)]
    gen = {v: helps[(v,)].split("  GEN ", 1)[1].split("options:")[0] for v in ("retry", "rollback")}
    assert "failed" in gen["retry"] and "cancels a pending" in gen["rollback"]
    assert gen["retry"] != gen["rollback"]
    assert "/var/lib/modstage/status)" in helps[("wait",)]
    flat = " ".join(helps[("verify",)].split())
    assert (
        "FILEs named together are judged as one bundle, in the order given (as intake and "
        "modprobe resolve them); a DIR is a drop, judged as its own bundle" in flat
    )

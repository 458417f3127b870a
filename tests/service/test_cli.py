"""The `modstage` command line: one command's parser, and the boot unit's line read without one."""

from __future__ import annotations

import argparse

import pytest

from service.parser import COMMANDS, build_parser


def _subparser(parser: argparse.ArgumentParser, name: str) -> argparse.ArgumentParser:
    (sub,) = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    found: argparse.ArgumentParser = sub.choices[name]
    return found


@pytest.mark.parametrize("name", sorted(COMMANDS))
def test_one_command_parser_equals_the_whole_parsers(name: str) -> None:
    """Each command's help (options, defaults, exit codes) is the same from either parser."""
    alone = _subparser(build_parser(name), name).format_help()
    assert alone == _subparser(build_parser(), name).format_help()


def test_every_command_has_a_builder() -> None:
    """The whole parser's commands are exactly the builders' commands, in --help order."""
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

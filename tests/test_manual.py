"""The manual page ``deploy/debian/manual`` writes from the verb table (the package build
runs it; ``tests/test_deb.py`` reads the page in the built package)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from service.parser import VERBS, build_parser

ROOT = Path(__file__).resolve().parents[1]


def test_the_manual_has_every_command_its_options_example_and_exit_status(
    tmp_path: Path,
) -> None:
    """Every command of the verb table (``config check`` as such) has its section in
    ``modstage.1`` with each of its options, its example's first line and its exit status,
    EXIT STATUS lists it, and groff renders the page without a warning."""
    subprocess.run([sys.executable, str(ROOT / "deploy/debian/manual"), str(tmp_path)], check=True)
    page = (tmp_path / "modstage.1").read_text()
    commands, _, exit_status = page.partition(".SH EXIT STATUS")
    parser = build_parser()
    names = [n for n, v in VERBS.items() if v.load is not None]
    assert {"intake", "forget", "sandbox"} <= set(names)
    for name, verb in VERBS.items():
        if verb.load is None:
            continue
        full = f"{verb.parent} {name}" if verb.parent else name
        start = commands.index(f".SS modstage {full}".replace("-", "\\-"))
        section = commands[start:].split("\n.SS ", 1)[0]
        first = verb.example.splitlines()[0].replace("\\", "\\e").replace("-", "\\-")
        assert first in section, (full, first)
        exits = " ".join(verb.exits.split()).replace("-", "\\-")
        assert exits in " ".join(section.split()), full
        assert f".B {full}\n".replace("-", "\\-") in exit_status, full
        sub = parser
        for word in full.split():
            sub = sub._subparsers._group_actions[0].choices[word]  # type: ignore[union-attr]
        for action in sub._actions:
            for option in action.option_strings:
                if option not in ("-h", "--help"):
                    assert option.replace("-", "\\-") in section, (full, option)
    done = subprocess.run(
        ["groff", "-man", "-z", "-ww"], input=page, capture_output=True, text=True
    )
    assert done.returncode == 0 and done.stderr == "", done.stderr

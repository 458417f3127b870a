"""The README's commands are real: each one parses, names a file that exists, or runs as shown."""

from __future__ import annotations

import io
import os
import re
import shlex
from pathlib import Path

import pytest

from service.cli import main
from service.parser import build_parser
from service.store.generations import Store
from service.store.state import State
from stager.paths import MANIFEST_NAME
from tests.service.test_status import NEW, failed_new, host

README = Path(__file__).resolve().parents[1] / "README.md"
EXTERNAL = {"apt-get", "cp"}  # Debian's own tools, not modstage's


def commands() -> list[list[str]]:
    """Every command in the README's code blocks: each line of an ``sh`` block, the ``$``
    lines of a ``console`` block, without comments."""
    out = []
    for kind, body in re.findall(r"```(sh|console)\n(.*?)```", README.read_text(), re.S):
        for line in body.splitlines():
            if kind == "console":
                if not line.startswith("$ "):
                    continue
                line = line[2:]
            words = shlex.split(line, comments=True)
            if words:
                out.append(words)
    return out


def test_the_readme_is_short_and_shows_commands() -> None:
    """A user's README: at most about 150 lines, with commands to check."""
    assert len(README.read_text().splitlines()) <= 155
    assert len(commands()) >= 10


@pytest.mark.parametrize("words", commands(), ids=lambda w: " ".join(w)[:60])
def test_each_command_parses_or_exists(words: list[str]) -> None:
    """``modstage ...`` parses with modstage's own parser; a script of the checkout exists
    and is executable; anything else is one of Debian's tools the text names."""
    if words[0] == "modstage":
        build_parser(words[1]).parse_args(words[1:])
    elif "/" in words[0]:
        script = README.parent / words[0]
        assert script.is_file() and os.access(script, os.X_OK), script
    else:
        assert words[0] in EXTERNAL, words


def test_the_failed_upgrade_example_runs_as_shown(tmp_path: Path) -> None:
    """On a sandbox root where a new generation failed and the old one came back, ``status``,
    ``generations`` and ``retry`` say what the README shows them saying."""
    layout = host(tmp_path, State({"nvidia": failed_new(fallback=True)}))
    stored = Store(layout.store).path(NEW)
    stored.mkdir(parents=True)
    (stored / MANIFEST_NAME).write_text("")  # retry asks only that the generation is kept
    root = ["--root", str(layout.root)]
    out = io.StringIO()
    assert main(["status", *root], out) == 1
    text = out.getvalue()
    assert text.startswith("host: DEGRADED") and f"nvidia: generation {NEW[:12]}" in text
    assert "bundle nvidia: active [DEGRADED]" in text
    out = io.StringIO()
    assert main(["generations", "nvidia", *root], out) == 0
    assert "[failed]" in out.getvalue()
    out = io.StringIO()
    assert main(["retry", "nvidia", *root], out) == 0
    assert out.getvalue().startswith(f"nvidia: retry recorded; phase pending, pending {NEW[:12]}")

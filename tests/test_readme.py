"""The README's commands are real: each one parses, names a file that exists, or runs as shown."""

from __future__ import annotations

import io
import os
import re
import shlex
from pathlib import Path

import pytest

from service.bundles.state import State
from service.cli import main
from service.generations.store import Store
from service.parser import build_parser
from stager.schema.paths import MANIFEST_NAME
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


def test_the_container_example_waits_for_the_drop_it_staged() -> None:
    """The README's container waits with ``--drop "$(modstage stage …)"``: the form that can
    never report the previous generation's success for a drop not yet taken in."""
    waits = [w for w in commands() if w[:2] == ["modstage", "wait"]]
    assert waits, "the README shows no wait"
    for words in waits:
        drop = words[words.index("--drop") + 1]
        assert drop.startswith("$(modstage stage ") and drop.endswith(")"), words
        build_parser("stage").parse_args(shlex.split(drop[2:-1])[1:])


def test_the_verify_example_names_a_store_path_that_exists(tmp_path: Path) -> None:
    """Store directories are named by the full generation id: the README's ``verify`` path,
    rooted in a sandbox, matches the stored module of the generation it names."""
    (verify,) = [w for w in commands() if w[:2] == ["modstage", "verify"]]
    shown = verify[2]
    prefix = shown.split("/store/")[1].split("/")[0].rstrip("*")
    gen = prefix + "0" * (64 - len(prefix))
    module = Store(tmp_path / "store").path(gen) / "modules" / "nvidia.ko"
    module.parent.mkdir(parents=True)
    module.write_bytes(b"")
    pattern = shown.replace("/var/lib/modstage/store/", "")
    assert list((tmp_path / "store").glob(pattern)) == [module]


def test_the_verbs_said_to_take_json_take_it() -> None:
    """Every command the README says takes ``--json`` parses with it; the one it says prints
    text only is refused it, so the sentence stays true."""
    text = " ".join(README.read_text().split())
    said = re.search(r"; (`status`.*?) take `--json`", text)
    assert said, "the README names the verbs that take --json"
    operands = {"retry": ["x"], "rollback": ["x"], "hold": ["x"], "release": ["x"]}
    operands["verify"] = ["x.ko"]
    for verb in re.findall(r"`([a-z ]+)`", said.group(1)):
        words = [*verb.split(), *operands.get(verb, []), "--json"]
        build_parser(words[0]).parse_args(words)
    with pytest.raises(SystemExit):
        build_parser("boot").parse_args(["boot", "--dry-run", "--json"])

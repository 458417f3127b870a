"""``status`` says when a bundle's module takes the name of an in-tree module of its
generation's kernel (a bundle's ``shadow_in_tree`` lets one in): a line of its own in the
plain view, ``shadows`` in the JSON signer rows."""

from __future__ import annotations

import io
import json
from pathlib import Path

from service.cli import main
from service.layout import Layout, modules_dir
from tests.service.fakes import pending


def cli(*argv: str) -> tuple[int, str]:
    """``modstage ARGV`` in this process: (exit code, stdout)."""
    out = io.StringIO()
    return main(list(argv), out), out.getvalue()


def test_a_module_named_like_an_in_tree_one_is_said_to_shadow_it(
    host: Layout, signed: dict[str, Path], kernel: str
) -> None:
    """With an in-tree ``ms_exporter`` in the kernel's tree, the bundle's ``ms_exporter``
    is said to shadow it, naming the in-tree file; before it exists nothing is said."""
    root = ["--root", str(host.root)]
    pending(host, kernel, [(signed["ms_exporter"], "")], bundle="demo")
    assert "shadows the in-tree" not in cli("status", *root)[1]
    own = modules_dir(host, kernel) / "kernel/drivers/misc/ms_exporter.ko"
    own.parent.mkdir(parents=True)
    own.write_bytes(b"")
    _, text = cli("status", *root)
    line = (
        "modules/ms_exporter.ko shadows the in-tree kernel/drivers/misc/ms_exporter.ko of "
        "its kernel: while it is loaded, the kernel's own module of that name cannot load"
    )
    assert line in text, text
    doc = json.loads(cli("status", *root, "--json")[1])
    [row] = doc["bundles"]["demo"]["signers"]
    assert row["shadows"] == "kernel/drivers/misc/ms_exporter.ko"

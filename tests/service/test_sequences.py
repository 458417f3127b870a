"""Sequences of drops, verbs and reboots on one host that once left status lying or a
record lost, each the shortest form of what the model (``test_model.py``) or a new user
found."""

from __future__ import annotations

import io
from pathlib import Path

from service.cli import main
from service.layout import Layout
from service.store.statefile import load
from stager.drop import ModuleSpec, stage
from tests.service.fakes import make_intake, pending


def cli(*argv: str) -> tuple[int, str]:
    """``modstage ARGV`` in this process: (exit code, stdout)."""
    out = io.StringIO()
    return main(list(argv), out), out.getvalue()


def test_a_typo_d_bundle_carrying_another_bundle_s_module_is_refused_naming_the_owner(
    host: Layout, signed: dict[str, Path], kernel: str
) -> None:
    """``demo`` has ms_exporter pending; a drop of ``dmeo`` with the same module is refused
    at intake, naming ``demo`` and its generation, and nothing of ``dmeo`` is recorded."""
    owner = pending(host, kernel, [(signed["ms_exporter"], "")], bundle="demo")
    stage(
        host.incoming,
        bundle="dmeo",
        version="1",
        kernel=kernel,
        modules=[ModuleSpec(signed["ms_exporter"])],
    )
    [outcome] = make_intake(host).run()
    assert not outcome.accepted
    assert outcome.reasons == (
        f"modules/ms_exporter.ko: module 'ms_exporter' belongs to bundle 'demo' (generation "
        f"{owner[:12]}): stage it as bundle 'demo', or first modstage forget demo if that "
        "name is the mistake",
    )
    assert "dmeo" not in load(host.state).bundles


def test_a_bundle_with_only_a_pending_generation_can_be_forgotten(
    host: Layout, signed: dict[str, Path], kernel: str
) -> None:
    """Nothing of a bundle never loaded is live: ``forget`` takes it, pending generation and
    all (and held, too); a bundle with an active generation is refused, saying so."""
    gen = pending(host, kernel, [(signed["ms_exporter"], "")], bundle="dmeo")
    assert cli("hold", "--root", str(host.root), "dmeo")[0] == 0
    code, out = cli("forget", "--root", str(host.root), "dmeo")
    assert code == 0, out
    assert "dmeo" not in load(host.state).bundles
    assert not (host.store / gen).exists() and not (host.status / "dmeo.json").exists()

"""One bundle per module name: intake and the admin's verbs never let two bundles' active or
pending generations carry the same module (the kernel loads a name once; the bundle booted
second would fail)."""

from __future__ import annotations

import io
from pathlib import Path

import pytest

from service.cli import main
from service.layout import Layout
from service.store.phase import Phase
from service.store.statefile import load
from stager.drop import ModuleSpec, stage
from tests.service.fakes import FakeKernel, boot_with, make_intake, pending


def cli(*argv: str) -> tuple[int, str]:
    """``modstage ARGV`` in this process: (exit code, stdout)."""
    out = io.StringIO()
    return main(list(argv), out), out.getvalue()


def test_a_rollback_to_a_generation_whose_module_another_bundle_took_is_refused(
    host: Layout, signed: dict[str, Path], kernel: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """``demo`` ran generation A (ms_exporter), then B (ms_params): A is retained but owns
    nothing, so a ``dmeo`` drop carrying ms_exporter is accepted. ``rollback demo A`` would
    make two bundles claim ms_exporter: it is refused, naming ``dmeo`` and the module, and
    the state is unchanged; once ``dmeo`` is forgotten the rollback goes through."""
    root = ["--root", str(host.root)]
    first = pending(host, kernel, [(signed["ms_exporter"], "")], bundle="demo")
    boot_with(host, FakeKernel(sys=host.sys)).run()
    pending(host, kernel, [(signed["ms_params"], "")], bundle="demo")
    boot_with(host, FakeKernel(sys=host.sys)).run()
    before = load(host.state)
    assert (
        before.bundle("demo").phase is Phase.ACTIVE and first in before.bundle("demo").generations
    )
    theirs = pending(host, kernel, [(signed["ms_exporter"], "")], bundle="dmeo")
    taken = load(host.state)
    capsys.readouterr()
    code, out = cli("rollback", *root, "demo", first)
    err = capsys.readouterr().err
    assert code != 0, out
    assert f"generation {first[:12]} loads module 'ms_exporter', which bundle 'dmeo' owns" in err
    assert load(host.state) == taken
    code, out = cli("forget", *root, "dmeo")
    assert code == 0, out
    code, out = cli("rollback", *root, "demo", first)
    assert code == 0, out
    assert load(host.state).bundle("demo").pending == first
    assert theirs not in load(host.state).bundle("demo").generations


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

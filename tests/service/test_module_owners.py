"""One bundle per module name: intake and the admin's verbs never let two bundles' active or
pending generations carry the same module (the kernel loads a name once; the bundle booted
second would fail)."""

from __future__ import annotations

import io
import lzma
import shutil
from pathlib import Path

import pytest

from service.bundles.phase import Phase
from service.bundles.statefile import load
from service.cli import main
from service.generations.store import Store
from service.intake.owners import NAMES
from service.layout import Layout
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
    assert (
        f"generation {first[:12]} loads module 'ms_exporter' (modules/ms_exporter.ko), which "
        "bundle 'dmeo' owns" in err
    )
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
        f"{owner[:12]}), so bundle 'dmeo' may not carry it: stage it as bundle 'demo', or "
        "first modstage forget demo if that name is the mistake",
    )
    assert "dmeo" not in load(host.state).bundles


def renamed(module: Path, to: Path) -> Path:
    """A copy of the signed ``module`` under the file name ``to`` (what it registers is
    unchanged: the name lives in its ``.gnu.linkonce.this_module``)."""
    to.parent.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(module, to)
    return to


def test_another_bundle_s_module_under_a_file_name_of_its_own_is_refused(
    host: Layout, signed: dict[str, Path], kernel: str, tmp_path: Path
) -> None:
    """``demo`` runs ms_params (count=3). ``aaa`` ships the same signed module as ``aaa.ko``
    with count=99: it registers ms_params, which ``demo`` owns, so intake refuses it naming
    both bundles, the module and the file (else ``aaa``, booted first by name, would load
    demo's module with aaa's parameters and demo would find it loaded)."""
    owner = pending(host, kernel, [(signed["ms_params"], "count=3")], bundle="demo")
    boot_with(host, FakeKernel(sys=host.sys)).run()
    assert load(host.state).bundle("demo").phase is Phase.ACTIVE
    stage(
        host.incoming,
        bundle="aaa",
        version="1",
        kernel=kernel,
        modules=[ModuleSpec(renamed(signed["ms_params"], tmp_path / "aaa.ko"), "count=99")],
    )
    [outcome] = make_intake(host).run()
    assert not outcome.accepted
    assert (
        f"modules/aaa.ko: module 'ms_params' belongs to bundle 'demo' (generation "
        f"{owner[:12]}), so bundle 'aaa' may not carry it" in " ".join(outcome.reasons)
    )
    assert "aaa" not in load(host.state).bundles


@pytest.mark.parametrize(
    ("recorded", "file"),
    [(True, "demo.ko"), (False, "demo.ko"), (False, "demo.ko.xz")],
    ids=["recorded", "recorded-before", "recorded-before-xz"],
)
def test_a_bundle_owns_the_name_its_renamed_module_registers(
    host: Layout, signed: dict[str, Path], kernel: str, tmp_path: Path, recorded: bool, file: str
) -> None:
    """``demo`` ships ms_params as ``demo.ko``: intake records in the store that the file
    registers ms_params, and ``demo`` owns that name, not ``demo``: an ``aaa`` drop of
    ms_params.ko is refused. A generation published before names were recorded (no record)
    owns what its stored modules register, the same, an xz-compressed one too."""
    module = tmp_path / file
    data = signed["ms_params"].read_bytes()
    if file.endswith(".xz"):  # as kbuild compresses a signed module: the whole file
        data = lzma.compress(data, check=lzma.CHECK_CRC32)
    module.write_bytes(data)
    owner = pending(host, kernel, [(module, "")], bundle="demo")
    stored = Store(host.store).path(owner)
    assert (stored / NAMES).read_text() == f'{{"modules/{file}": "ms_params"}}'
    if not recorded:
        stored.chmod(0o755)
        (stored / NAMES).unlink()
        stored.chmod(0o555)
    stage(
        host.incoming,
        bundle="aaa",
        version="1",
        kernel=kernel,
        modules=[ModuleSpec(signed["ms_params"])],
    )
    [outcome] = make_intake(host).run()
    assert not outcome.accepted
    assert "module 'ms_params' belongs to bundle 'demo'" in " ".join(outcome.reasons)


def test_a_rollback_to_a_renamed_module_another_bundle_took_is_refused(
    host: Layout,
    signed: dict[str, Path],
    kernel: str,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """``demo``'s retained generation A ships ms_exporter as ``x.ko``; ``dmeo`` took
    ms_exporter since. ``rollback demo A`` is refused by the name A's module registers,
    naming the module, its file and ``dmeo``."""
    root = ["--root", str(host.root)]
    x = renamed(signed["ms_exporter"], tmp_path / "x.ko")
    first = pending(host, kernel, [(x, "")], bundle="demo")
    boot_with(host, FakeKernel(sys=host.sys)).run()
    pending(host, kernel, [(signed["ms_params"], "")], bundle="demo")
    boot_with(host, FakeKernel(sys=host.sys)).run()
    pending(host, kernel, [(signed["ms_exporter"], "")], bundle="dmeo")
    taken = load(host.state)
    capsys.readouterr()
    code, out = cli("rollback", *root, "demo", first)
    err = capsys.readouterr().err
    assert code != 0, out
    assert "loads module 'ms_exporter' (modules/x.ko), which bundle 'dmeo' owns" in err
    assert load(host.state) == taken

"""One bundle per firmware name: intake refuses a drop carrying a firmware file another
bundle's active or pending generation carries, under the same name or one of its compressed
forms, whatever the host's tables allow (the firmware view holds one file per request: at
boot the bundle linked first would take it and the other's good generation fail).

Real signed modules: ``ms_firmware`` declares ``modstage/test.bin``, ``ms_exporter`` nothing
(its bundle's ``firmware`` table admits the name)."""

from __future__ import annotations

import contextlib
import io
from pathlib import Path

import pytest

from service.bundles.phase import Phase
from service.bundles.statefile import load
from service.cli import main
from service.config import Config
from service.layout import Layout
from stager.drop import ModuleSpec, stage
from tests.service.fakes import FakeKernel, boot_with, make_intake

POLICY = Config.from_dict(
    {"bundles": {"aaa": {"firmware": ["modstage/*"], "firmware_override": ["modstage/*"]}}}
)


def _stage(host: Layout, kernel: str, bundle: str, module: Path, firmware: Path) -> None:
    stage(
        host.incoming,
        bundle=bundle,
        version="1",
        kernel=kernel,
        modules=[ModuleSpec(module, "")],
        firmware_dirs=(firmware,),
    )


def _tree(root: Path, name: str, body: bytes) -> Path:
    (root / name).parent.mkdir(parents=True, exist_ok=True)
    (root / name).write_bytes(body)
    return root


@pytest.mark.parametrize("name", ["modstage/test.bin", "modstage/test.bin.xz"])
def test_a_firmware_name_another_bundle_carries_is_refused_naming_that_bundle(
    host: Layout, signed: dict[str, Path], kernel: str, tmp_path: Path, name: str
) -> None:
    """``demo`` runs ``modstage/test.bin``. ``aaa`` ships other bytes as ``test.bin`` (or
    ``test.bin.xz``, which answers the same request), its table allowing and overriding
    the name: refused, naming the file, ``demo`` and its generation; ``demo`` stays active."""
    genuine = _tree(tmp_path / "a", "modstage/test.bin", b"genuine")
    _stage(host, kernel, "demo", signed["ms_firmware"], genuine)
    [taken] = make_intake(host, POLICY).run()
    assert taken.accepted, taken.reasons
    boot_with(host, FakeKernel(sys=host.sys)).run()
    _stage(host, kernel, "aaa", signed["ms_exporter"], _tree(tmp_path / "b", name, b"hostile"))
    [outcome] = make_intake(host, POLICY).run()
    assert not outcome.accepted
    assert outcome.reasons == (
        f"firmware/{name}: bundle 'demo' carries firmware/modstage/test.bin (generation "
        f"{str(taken.generation)[:12]}), the firmware 'modstage/test.bin' too, so bundle "
        "'aaa' may not: one file answers a request; stage it in one bundle",
    )
    assert "aaa" not in load(host.state).bundles
    assert load(host.state).bundle("demo").phase is Phase.ACTIVE


def test_another_firmware_name_beside_another_bundle_s_is_taken_in(
    host: Layout, signed: dict[str, Path], kernel: str, tmp_path: Path
) -> None:
    """A name no other bundle carries is taken in beside ``demo``'s ``modstage/test.bin``."""
    _stage(
        host,
        kernel,
        "demo",
        signed["ms_firmware"],
        _tree(tmp_path / "a", "modstage/test.bin", b"1"),
    )
    [taken] = make_intake(host, POLICY).run()
    assert taken.accepted, taken.reasons
    _stage(
        host,
        kernel,
        "aaa",
        signed["ms_exporter"],
        _tree(tmp_path / "b", "modstage/other.bin", b"2"),
    )
    [outcome] = make_intake(host, POLICY).run()
    assert outcome.accepted, outcome.reasons


def test_a_rollback_to_firmware_another_bundle_took_is_refused(
    host: Layout, signed: dict[str, Path], kernel: str, tmp_path: Path
) -> None:
    """``demo``'s retained generation A carries ``modstage/test.bin``; ``aaa`` took that
    name since (A was neither active nor pending). ``rollback demo A`` is refused naming
    ``aaa`` and both files, and the state is unchanged."""
    fw = _tree(tmp_path / "a", "modstage/test.bin", b"genuine")
    _stage(host, kernel, "demo", signed["ms_firmware"], fw)
    [first] = make_intake(host, POLICY).run()
    boot_with(host, FakeKernel(sys=host.sys)).run()
    stage(
        host.incoming,
        bundle="demo",
        version="2",
        kernel=kernel,
        modules=[ModuleSpec(signed["ms_params"], "")],
    )
    [second] = make_intake(host, POLICY).run()
    assert second.accepted, second.reasons
    boot_with(host, FakeKernel(sys=host.sys)).run()
    _stage(
        host,
        kernel,
        "aaa",
        signed["ms_exporter"],
        _tree(tmp_path / "b", "modstage/test.bin.xz", b"x"),
    )
    [theirs] = make_intake(host, POLICY).run()
    assert theirs.accepted, theirs.reasons
    taken = load(host.state)
    out = io.StringIO()
    err = io.StringIO()
    with contextlib.redirect_stderr(err):
        code = main(["rollback", "--root", str(host.root), "demo", str(first.generation)], out)
    assert code != 0, out.getvalue()
    assert (
        f"carries firmware/modstage/test.bin, and bundle 'aaa' carries "
        f"firmware/modstage/test.bin.xz now (generation {str(theirs.generation)[:12]})"
        in err.getvalue()
    )
    assert load(host.state) == taken

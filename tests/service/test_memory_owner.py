"""The host has one memory onlining policy: a bundle whose active or pending generation
asks for one owns it, and another bundle's drop asking for a different one is refused at
intake, naming the owner; the same policy, or none, is taken in."""

from __future__ import annotations

from pathlib import Path

from service.bundles.statefile import load
from service.layout import Layout
from stager.drop import ModuleSpec, stage
from tests.service.fakes import FakeKernel, boot_with, make_intake


def _drop(host: Layout, bundle: str, module: Path, kernel: str, memory: str | None) -> None:
    """Stage ``bundle`` with one module and ``memory`` as its manifest's policy."""
    stage(
        host.incoming,
        bundle=bundle,
        version="1",
        kernel=kernel,
        modules=[ModuleSpec(module, "")],
        memory=memory,
    )


def test_another_bundles_different_policy_is_refused_and_the_owners_stays(
    host: Layout, signed: dict[str, Path], kernel: str
) -> None:
    """nvidia asks online_movable; zzz's drop asking offline is refused naming nvidia,
    and the boot leaves the host's policy as nvidia asked."""
    _drop(host, "nvidia", signed["ms_params"], kernel, "online_movable")
    assert make_intake(host).run()[0].accepted
    _drop(host, "zzz", signed["ms_exporter"], kernel, "offline")
    [refused] = make_intake(host).run()
    assert not refused.accepted
    assert "bundle 'nvidia'" in refused.reasons[0] and "'online_movable'" in refused.reasons[0]
    assert "zzz" not in load(host.state).bundles
    boot_with(host, FakeKernel(sys=host.sys)).run()
    policy = (host.sys / "devices/system/memory/auto_online_blocks").read_text().strip()
    assert policy == "online_movable"


def test_the_same_policy_or_none_is_taken_in(
    host: Layout, signed: dict[str, Path], kernel: str
) -> None:
    """A second bundle asking for the owner's policy, and a third asking for none, are
    both taken in."""
    _drop(host, "nvidia", signed["ms_params"], kernel, "online_movable")
    assert make_intake(host).run()[0].accepted
    _drop(host, "mofed", signed["ms_exporter"], kernel, "online_movable")
    _drop(host, "plain", signed["ms_enodev"], kernel, None)
    outcomes = make_intake(host).run()
    assert [o.reasons for o in outcomes if not o.accepted] == []

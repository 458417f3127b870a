"""A module belongs to one bundle at boot too: when two bundles' generations carry a
module of the same name (a state recorded before intake compared the names the kernel
registers), the bundle booted second fails naming the first, instead of reporting
``active`` on a module another bundle loaded with its own parameters."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from service.bundles.phase import Phase
from service.bundles.state import State
from service.bundles.statefile import load, save
from service.layout import Layout
from tests.service.fakes import FakeKernel, boot_with, pending


def test_the_second_bundle_carrying_a_loaded_name_fails_naming_the_first(
    host: Layout, signed: dict[str, Path], kernel: str
) -> None:
    """Bundles ``aaa`` and ``demo`` both pending a generation loading ``ms_params``: boot
    brings ``aaa`` up (first by name), loads ``ms_params`` once, and fails ``demo`` with
    a reason naming ``aaa``."""
    gen = pending(host, kernel, [(signed["ms_params"], "count=3")], bundle="demo")
    demo = load(host.state).bundle("demo")
    save(host.state, State({"aaa": demo, "demo": replace(demo)}))
    fake = FakeKernel(sys=host.sys)
    state = boot_with(host, fake).run()
    assert state.bundle("aaa").phase is Phase.ACTIVE and state.bundle("aaa").active == gen
    assert state.bundle("demo").phase is Phase.FAILED
    failed = state.bundle("demo").generations[gen].failed or ""
    assert "bundle 'aaa' loaded a module of that name in this boot" in failed
    assert [c for c in fake.calls if c[0] == "load"] == [("load", "ms_params", "count=3")]


def test_a_renamed_file_carrying_a_loaded_module_is_no_already_loaded_success(
    host: Layout, signed: dict[str, Path], kernel: str, tmp_path: Path
) -> None:
    """``demo`` loads ``ms_params``; bundle ``zzz`` (booted after it) carries the same
    module under the file name ``zzz.ko``: the kernel's registered name is compared, so
    ``zzz`` fails naming ``demo`` instead of counting demo's live module as its own."""
    renamed = tmp_path / "zzz.ko"
    renamed.write_bytes(signed["ms_params"].read_bytes())
    theirs = pending(host, kernel, [(renamed, "count=99")], bundle="zzz")
    zzz = load(host.state).bundle("zzz")
    save(host.state, State({}))  # each taken in while the other did not exist
    pending(host, kernel, [(signed["ms_params"], "count=3")], bundle="demo")
    demo = load(host.state).bundle("demo")
    save(host.state, State({"demo": demo, "zzz": zzz}))
    fake = FakeKernel(sys=host.sys)
    state = boot_with(host, fake).run()
    assert state.bundle("demo").phase is Phase.ACTIVE
    assert state.bundle("zzz").phase is Phase.FAILED
    assert "bundle 'demo' loaded a module of that name" in (
        state.bundle("zzz").generations[theirs].failed or ""
    )
    assert [c for c in fake.calls if c[0] == "load"] == [("load", "ms_params", "count=3")]

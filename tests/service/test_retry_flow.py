"""A failed upgrade diagnosed and retried with the verbs, on a temporary host."""

from __future__ import annotations

import errno
import io
from pathlib import Path

from service.cli import main
from service.layout import Layout
from service.store.phase import Phase
from service.store.statefile import load
from stager.drop import ModuleSpec, stage
from tests.service.fakes import FakeKernel, make_intake
from tests.service.fakes import boot_with as _boot
from tests.service.fakes import pending as _pending


def _stage_again(host: Layout, kernel: str, module: Path, version: str) -> list[str]:
    stage(
        host.incoming, bundle="test", version=version, kernel=kernel, modules=[ModuleSpec(module)]
    )
    intake = make_intake(host)
    return [r for o in intake.run() for r in o.reasons]


def test_a_generation_refused_at_boot_loads_after_retry(
    host: Layout, signed: dict[str, Path], kernel: str
) -> None:
    """v2 fails with ENOKEY (the MOK key not yet enrolled); after ``retry`` the next boot loads
    it, and re-staging the identical bundle is accepted again instead of refused forever."""
    v1 = _pending(host, kernel, [(signed["ms_exporter"], "")])
    _boot(host, FakeKernel()).run()
    v2 = _pending(host, kernel, [(signed["ms_params"], "")], "2")
    _boot(host, FakeKernel(fail={"ms_params": errno.ENOKEY})).run()
    b = load(host.state).bundle("test")
    assert (b.active, b.generations[v2].failed is not None) == (v1, True)
    assert "already failed" in _stage_again(host, kernel, signed["ms_params"], "2")[0]
    out = io.StringIO()
    assert main(["retry", "--root", str(host.root), "test"], out) == 0
    assert _stage_again(host, kernel, signed["ms_params"], "2") == []  # accepted now
    fake = FakeKernel()
    b = _boot(host, fake).run().bundle("test")
    assert fake.calls == [("load", "ms_params", "")]
    assert (b.phase, b.active, b.pending) == (Phase.ACTIVE, v2, None)


def test_a_held_bundle_takes_no_new_generation(
    host: Layout, signed: dict[str, Path], kernel: str
) -> None:
    """While held, a new drop is refused naming the hold; after release it is taken."""
    _pending(host, kernel, [(signed["ms_exporter"], "")])
    assert main(["hold", "--root", str(host.root), "test"], io.StringIO()) == 0
    reasons = _stage_again(host, kernel, signed["ms_params"], "2")
    assert reasons == ["bundle 'test' is held by an admin (modstage release)"]
    assert main(["release", "--root", str(host.root), "test"], io.StringIO()) == 0
    assert _stage_again(host, kernel, signed["ms_params"], "2") == []

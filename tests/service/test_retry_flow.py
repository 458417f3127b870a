"""A failed upgrade diagnosed and retried with the verbs, on a temporary host."""

from __future__ import annotations

import errno
import io
from pathlib import Path

from service.bundles.phase import Phase
from service.bundles.statefile import load
from service.cli import main
from service.layout import Layout
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
    """While held, a new drop is never thrown away: it waits in incoming (intake says it is
    deferred and exits 0: waiting is no failure) and the same drop is taken in after release; the pending generation recorded before the
    hold does not load at boot while held (the last known good does), and loads after
    release."""
    v1 = _pending(host, kernel, [(signed["ms_exporter"], "")])
    fake = FakeKernel()
    _boot(host, fake).run()
    v2 = _pending(host, kernel, [(signed["ms_params"], "")], version="2")
    root = ["--root", str(host.root)]
    out = io.StringIO()
    assert main(["hold", *root, "test"], out) == 0
    assert "waits for release while held" in out.getvalue()
    fake = FakeKernel()
    b = _boot(host, fake).run().bundle("test")
    assert (b.active, b.pending) == (v1, v2) and fake.calls == [("load", "ms_exporter", "")]
    drop = stage(
        host.incoming,
        bundle="test",
        version="3",
        kernel=kernel,
        modules=[ModuleSpec(signed["ms_exporter"], "x=1")],
    )
    out = io.StringIO()
    assert main(["intake", *root], out) == 0  # a drop that waits is no failure
    assert "deferred" in out.getvalue() and "held by an admin" in out.getvalue()
    assert drop.is_dir()
    assert not (host.quarantine / drop.name).exists()
    assert main(["release", *root, "test"], io.StringIO()) == 0
    assert main(["intake", *root], io.StringIO()) == 0 and not drop.exists()

"""Drops that wait in incoming instead of being judged: behind an admin's pending rollback,
or for a kernel whose module tree is not installed yet; and the retry a drop replaces."""

from __future__ import annotations

import errno
import io
import shutil
from pathlib import Path

from structlog.testing import capture_logs

from service.bundles.phase import Phase
from service.bundles.statefile import load
from service.cli import main
from service.layout import Layout, modules_dir
from service.status.collect import collect
from stager.drop import ModuleSpec, stage
from stager.schema.statusfile import StatusFile
from tests.kmod import install_target
from tests.service.fakes import FakeKernel, make_intake
from tests.service.fakes import boot_with as _boot
from tests.service.fakes import pending as _pending


def _drop(host: Layout, kernel: str, module: Path, version: str) -> Path:
    """A complete drop of bundle ``test`` in incoming."""
    return stage(
        host.incoming, bundle="test", version=version, kernel=kernel, modules=[ModuleSpec(module)]
    )


def _cli(host: Layout, *argv: str) -> tuple[int, str]:
    out = io.StringIO()
    code = main([argv[0], "--root", str(host.root), *argv[1:]], out)
    return code, out.getvalue()


def _status(host: Layout) -> StatusFile:
    doc = StatusFile.read(host.status / "test.json")
    assert doc is not None
    return doc


def _rolled_back(host: Layout, kernel: str, signed: dict[str, Path]) -> tuple[str, str]:
    """v1 then v2 active in turn, then ``modstage rollback test`` (to v1): (v1, v2)."""
    v1 = _pending(host, kernel, [(signed["ms_exporter"], "")])
    _boot(host, FakeKernel()).run()
    v2 = _pending(host, kernel, [(signed["ms_params"], "")], "2")
    _boot(host, FakeKernel()).run()
    code, out = _cli(host, "rollback", "test", v1[:12])
    assert code == 0, out
    return v1, v2


def test_a_drop_waits_behind_an_admins_pending_rollback(
    host: Layout, signed: dict[str, Path], kernel: str
) -> None:
    """After ``rollback``, a new drop of the bundle does not replace the rollback: it waits in
    incoming (deferred, exit 0, not quarantined), its status file and ``status`` say it waits
    for the rollback and name the command that cancels it, the log warns, state is
    unchanged; once the admin runs that command the same drop is taken in."""
    v1, v2 = _rolled_back(host, kernel, signed)
    before = host.state.read_bytes()
    drop = _drop(host, kernel, signed["ms_params"], "3")
    with capture_logs() as logs:
        [outcome] = make_intake(host).run()
    assert outcome.deferred and outcome.waiting and not outcome.accepted
    code, out = _cli(host, "intake")  # the same drop, deferred again
    assert code == 0, out
    assert "deferred" in out and f"pending rollback to {v1[:12]} (1)" in out
    assert drop.is_dir() and not (host.quarantine / drop.name).exists()
    assert host.state.read_bytes() == before
    doc = _status(host)
    assert doc.drop == drop.name and doc.pending == v1
    assert any(f"pending rollback to {v1[:12]}" in e for e in doc.errors), doc.errors
    [warning] = [e for e in logs if e["event"] == "drop.waits_for_rollback"]
    assert warning["log_level"] == "warning" and warning["drop"] == drop.name
    code, shown = _cli(host, "status")
    assert f"pending rollback to {v1[:12]}" in shown, shown
    assert not any("rejected" in r for r in collect(host).bundles["test"].reasons)
    command = f"modstage rollback test {v2[:12]}"  # the 12 characters status shows of an id
    assert f"or {command} cancels it" in outcome.reasons[0], outcome.reasons
    assert _cli(host, *command.split()[1:])[0] == 0  # the command it names cancels: v2 stays
    [outcome] = make_intake(host).run()
    assert outcome.accepted and not drop.exists()
    b = load(host.state).bundle("test")
    assert (b.phase, b.active, b.pending) == (Phase.PENDING, v2, outcome.generation)


def test_a_drop_waits_until_the_rollback_is_live(
    host: Layout, signed: dict[str, Path], kernel: str
) -> None:
    """The drop that waited behind a rollback is taken in once the boot brought the rollback
    up (v1 active), and only then: the rollback is what the next boot loads."""
    v1, _v2 = _rolled_back(host, kernel, signed)
    drop = _drop(host, kernel, signed["ms_params"], "3")
    [first] = make_intake(host).run()
    assert first.deferred and first.waiting and drop.is_dir()
    fake = FakeKernel()
    b = _boot(host, fake).run().bundle("test")
    assert (b.active, b.pending) == (v1, None) and fake.calls == [("load", "ms_exporter", "")]
    [second] = make_intake(host).run()
    assert second.accepted and not drop.exists()
    b = load(host.state).bundle("test")
    assert (b.active, b.pending) == (v1, second.generation)
    assert b.history[-1].note == f"generation {str(second.generation)[:12]} pending"


def test_the_generation_rolled_back_from_is_not_taken_back_until_a_retry(
    host: Layout, signed: dict[str, Path], kernel: str
) -> None:
    """Once the rollback is live, the driver's container dropping the generation the admin
    rolled back from (the same build again) is refused, naming the rollback and the retry
    that brings it back, so a driver an admin took off a node is not marched back onto it;
    a newer build is taken in. ``retry`` brings the rolled-back one back; cancelling the
    rollback before its boot lifts the bar too."""
    v1, v2 = _rolled_back(host, kernel, signed)
    assert load(host.state).bundle("test").generations[v2].rolled_back is not None
    _boot(host, FakeKernel()).run()
    again = _drop(host, kernel, signed["ms_params"], "2")
    [outcome] = make_intake(host).run()
    assert not outcome.accepted and not again.exists()
    said = " ".join(outcome.reasons)
    assert f"was rolled back by an admin (rollback to {v1[:12]} (1))" in said, said
    assert f"modstage retry test {v2[:12]} brings it back" in said, said
    b = load(host.state).bundle("test")
    # v1 stays; with this test's kernel its modules look unloaded, so the refusal makes v1
    # pending again (reloaded, as after a driver pod's unload), never v2
    assert b.active == v1 and b.pending in (None, v1)
    code, out = _cli(host, "retry", "test", v2[:12])
    assert code == 0, out
    b = load(host.state).bundle("test")
    assert b.pending == v2 and b.generations[v2].rolled_back is None
    assert b.history[-1].note.startswith(f"admin: retry {v2[:12]} (rolled back: rollback to")
    # a rollback cancelled before its boot keeps nothing out
    _boot(host, FakeKernel()).run()
    assert _cli(host, "rollback", "test", v1[:12])[0] == 0
    assert load(host.state).bundle("test").generations[v2].rolled_back is not None
    assert _cli(host, "rollback", "test", v2[:12])[0] == 0
    assert load(host.state).bundle("test").generations[v2].rolled_back is None


def test_a_drop_replaces_a_pending_retry_and_says_so(
    host: Layout, signed: dict[str, Path], kernel: str
) -> None:
    """A retry is the admin trying a failed generation again: a newer drop replaces it, and
    the new pending generation's history note and a warning in the log name the retry."""
    _pending(host, kernel, [(signed["ms_exporter"], "")])
    _boot(host, FakeKernel()).run()
    v2 = _pending(host, kernel, [(signed["ms_params"], "")], "2")
    _boot(host, FakeKernel(fail={"ms_params": errno.ENOKEY})).run()
    assert _cli(host, "retry", "test")[0] == 0
    _drop(host, kernel, signed["ms_params"], "3")
    with capture_logs() as logs:
        [outcome] = make_intake(host).run()
    assert outcome.accepted, outcome.reasons
    b = load(host.state).bundle("test")
    replaced = f"replaces the admin's pending retry of {v2[:12]} (2)"
    assert b.pending == outcome.generation and b.chosen is None
    assert b.history[-1].note == f"generation {str(outcome.generation)[:12]} pending; {replaced}"
    [warning] = [e for e in logs if e["event"] == "drop.replaces_admin_choice"]
    assert warning["log_level"] == "warning" and warning["replaces"] in b.history[-1].note


def test_a_drop_for_a_kernel_not_installed_waits_until_its_tree_exists(
    host: Layout, signed: dict[str, Path], kernel: str
) -> None:
    """Without ``lib/modules/<release>`` for the drop's kernel modstage cannot judge it: the
    drop is deferred (kept in incoming, exit 0), not rejected nor quarantined; its status
    names the missing tree and the host is not degraded by it; once the tree is installed
    the same drop is taken in."""
    tree = modules_dir(host, kernel)
    shutil.rmtree(tree)
    drop = _drop(host, kernel, signed["ms_exporter"], "1")
    code, out = _cli(host, "intake")
    assert code == 0 and "deferred" in out, out
    assert drop.is_dir() and not (host.quarantine / drop.name).exists()
    doc = _status(host)
    assert doc.phase != Phase.REJECTED.value and doc.drop == drop.name
    assert any(f"{tree} is missing" in e for e in doc.errors), doc.errors
    assert not any("rejected" in r for r in collect(host).bundles["test"].reasons)
    assert f"{tree} is missing" in _cli(host, "status")[1]
    assert "test" not in load(host.state).bundles
    install_target(host.root, kernel)
    [outcome] = make_intake(host).run()
    assert outcome.accepted, outcome.reasons
    assert not drop.exists() and load(host.state).bundle("test").pending == outcome.generation


def test_wait_says_why_a_drop_waits(host: Layout, signed: dict[str, Path], kernel: str) -> None:
    """``modstage wait`` for a drop deferred behind a rollback keeps waiting (no exit code)
    and says why, from the status file intake wrote; before the deferral it did not."""
    from stager.wait import Awaited, judge

    v1, _v2 = _rolled_back(host, kernel, signed)
    drop = _drop(host, kernel, signed["ms_params"], "3")
    target = Awaited.from_drop(drop)
    assert "waits" not in judge(_status(host), target).message
    make_intake(host).run()
    outcome = judge(_status(host), target)
    assert outcome.code is None
    assert outcome.message.startswith("the drop waits in incoming: ")
    assert f"pending rollback to {v1[:12]}" in outcome.message

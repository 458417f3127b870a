"""``wait`` answers 0 only for a generation whose modules are live in this boot: sequences
that once made the status file say otherwise, each the shortest form of what the model
(``test_model.py``) found."""

from __future__ import annotations

import errno
import io
from dataclasses import replace
from pathlib import Path

from service.bundles.phase import Phase
from service.bundles.statefile import load
from service.cli import main
from service.layout import Layout
from stager.drop import ModuleSpec, stage
from tests.hosts import KEEP, running_host
from tests.kmod import SigningKey, sign
from tests.service.fakes import FakeKernel, boot_with, pending
from tests.service.test_sequences import reboot


def cli(*argv: str) -> tuple[int, str]:
    """``modstage ARGV`` in this process: (exit code, stdout)."""
    out = io.StringIO()
    return main(list(argv), out), out.getvalue()


def _wait(host: Layout, generation: str) -> tuple[int, str]:
    return cli(
        *("wait", "--status-dir", str(host.status), "--bundle", "demo"),
        *("--generation", generation, "--timeout", "0", "--boot-id-file", str(host.boot_id)),
    )


def _failed_after_a_driver_less_boot(host: Layout, signed: dict[str, Path], kernel: str) -> str:
    """v1 (ms_exporter, ms_consumer) booted and live (``wait`` exits 0: the control); a boot
    into another kernel loads nothing; back on v1's kernel a boot whose kernel refuses
    ms_consumer fails v1 (``failed``). Returns v1."""
    root = ["--root", str(host.root)]
    v1 = pending(
        host, kernel, [(signed["ms_exporter"], ""), (signed["ms_consumer"], "")], bundle="demo"
    )
    assert cli("boot", *root)[0] == 0
    assert _wait(host, v1)[0] == 0  # live: the control
    reboot(host)
    running_host(host, "6.99.0-other", KEEP)
    assert cli("boot", *root)[0] == 1
    reboot(host)
    running_host(host, kernel, KEEP)
    state = boot_with(host, FakeKernel(fail={"ms_consumer": errno.ENOKEY}, sys=host.sys)).run()
    assert state.bundle("demo").phase is Phase.FAILED
    return v1


def test_a_verb_after_a_failed_boot_does_not_make_wait_call_the_generation_active(
    host: Layout, signed: dict[str, Path], kernel: str
) -> None:
    """v1 (two modules) active; a boot into another kernel loads nothing (no module recorded
    loaded); back on v1's kernel, a boot whose kernel refuses one of v1's modules leaves
    nothing of it loaded (``failed``, nothing recorded loaded); an admin's ``hold`` and ``release`` then
    rewrite the status file with the bundle's phase moved on: ``wait`` for v1 still never
    exits 0 (nothing recorded loaded means nothing is live, whatever the phase, unless the
    bundle is ``active``)."""
    root = ["--root", str(host.root)]
    v1 = _failed_after_a_driver_less_boot(host, signed, kernel)
    assert not load(host.state).bundle("demo").loaded
    for verb in ("retry", "hold", "release"):
        cli(verb, *root, "demo")
        code, out = _wait(host, v1)
        assert code != 0, f"after {verb}: {out}"


def test_nothing_recorded_loaded_is_not_live_unless_the_bundle_is_active(
    host: Layout, kernel: str
) -> None:
    """The status file of a bundle whose active generation has nothing recorded loaded (a
    boot that failed it, then a drop or a verb moved the phase on: ``pending``, ``failed``,
    ``reboot_scheduled``) says ``live: false``, so ``wait`` never calls that generation
    active; only an ``active`` bundle with no record (a state written before loads were
    recorded) stays unknown (``live`` absent)."""
    from service.bundles.state import BundleState, Generation
    from service.publish.bundle_status import write_status
    from stager.schema.statusfile import StatusFile

    v1, v2 = "a" * 64, "b" * 64
    b = BundleState().with_generation(Generation(v1, "1", kernel, added=1.0))
    b = (
        b.move(Phase.PENDING, pending=v1)
        .move(Phase.LOADING)
        .move(Phase.ACTIVE, active=v1, pending=None)
    )
    b = b.with_generation(Generation(v2, "2", kernel, added=2.0))
    for phase, pending_gen in (
        (Phase.PENDING, v2),
        (Phase.FAILED, None),
        (Phase.REBOOT_SCHEDULED, v2),
    ):
        moved = replace(b, phase=phase, pending=pending_gen)  # as a sequence leaves it
        doc: StatusFile = write_status(host, "demo", moved)
        assert doc.live is False, (phase, doc.live)
        assert _wait(host, v1)[0] != 0, phase
    assert write_status(host, "demo", b).live is None


def test_wait_for_a_rejected_drop_says_rejected_after_a_reboot(
    host: Layout, signed: dict[str, Path], other_key: SigningKey, kernel: str, tmp_path: Path
) -> None:
    """v1 active; drop D, signed by a key the host does not trust, is rejected and ``wait
    --drop D`` exits 1; after a reboot (the boot rewrites the status file) and another
    accepted drop it still exits 1, never 0 for the active generation."""
    root = ["--root", str(host.root)]
    pending(host, kernel, [(signed["ms_exporter"], "")], bundle="demo")
    assert cli("boot", *root)[0] == 0
    untrusted = sign(signed["ms_params"], other_key, tmp_path / "untrusted.ko")
    drop = stage(
        host.incoming, bundle="demo", version="2", kernel=kernel, modules=[ModuleSpec(untrusted)]
    )
    assert cli("intake", *root)[0] == 1
    wait = ["wait", "--bundle", "demo", "--drop", str(drop), "--timeout", "0"]
    wait += ["--status-dir", str(host.status)]
    assert cli(*wait)[0] == 1
    reboot(host)
    assert cli("boot", *root)[0] == 0
    code, out = cli(*wait)
    assert code == 1 and "drop rejected: " in out, out
    pending(host, kernel, [(signed["ms_params"], "")], version="3", bundle="demo")
    assert cli(*wait)[0] == 1


def test_wait_does_not_call_a_generation_active_before_boot_loaded_it_in_this_boot(
    host: Layout, signed: dict[str, Path], kernel: str
) -> None:
    """v1 went live and ``wait`` exits 0; after a reboot whose ``modstage boot`` has not run
    (nothing live), ``wait`` keeps waiting (exit 3 at its timeout), even once a verb rewrote
    the status file in this boot; after the boot it exits 0 again."""
    root = ["--root", str(host.root)]
    v1 = pending(host, kernel, [(signed["ms_exporter"], "")], bundle="demo")
    assert cli("boot", *root)[0] == 0
    wait = ["wait", "--bundle", "demo", "--generation", v1, "--timeout", "0"]
    wait += ["--status-dir", str(host.status), "--boot-id-file", str(host.boot_id)]
    assert cli(*wait)[0] == 0
    reboot(host)
    code, out = cli(*wait)
    assert code == 3 and "not live in this boot" in out, out
    assert cli("hold", *root, "demo")[0] == 0
    assert cli(*wait)[0] == 3
    assert cli("boot", *root)[0] == 0
    assert cli(*wait)[0] == 0


def test_wait_for_a_drop_the_host_has_no_record_of_never_answers_for_another_generation(
    host: Layout, signed: dict[str, Path], other_key: SigningKey, kernel: str, tmp_path: Path
) -> None:
    """``dmeo``'s drop D was rejected and ``forget dmeo`` cleared its records; a later drop of
    ``dmeo`` went live: ``wait --drop D`` keeps waiting (the host has no record of D) instead
    of calling the later generation D's, while ``wait`` for the later drop exits 0."""
    root = ["--root", str(host.root)]
    untrusted = sign(signed["ms_params"], other_key, tmp_path / "untrusted.ko")
    rejected = stage(
        host.incoming, bundle="dmeo", version="1", kernel=kernel, modules=[ModuleSpec(untrusted)]
    )
    assert cli("intake", *root)[0] == 1
    assert cli("forget", *root, "dmeo")[0] == 0
    later = stage(
        host.incoming,
        bundle="dmeo",
        version="2",
        kernel=kernel,
        modules=[ModuleSpec(signed["ms_params"])],
    )
    assert cli("intake", *root)[0] == 0
    assert cli("boot", *root)[0] == 0
    wait = ["wait", "--bundle", "dmeo", "--timeout", "0", "--status-dir", str(host.status)]
    wait += ["--boot-id-file", str(host.boot_id)]
    code, out = cli(*wait, "--drop", str(rejected))
    assert code == 3 and "no record of drop" in out, out
    assert cli(*wait, "--drop", str(later))[0] == 0


def test_wait_for_a_bundle_the_host_does_not_know_names_those_it_knows(
    host: Layout, signed: dict[str, Path], kernel: str
) -> None:
    """``wait --bundle dmeo`` (a typo) on a host that knows ``demo`` says so at once."""
    pending(host, kernel, [(signed["ms_exporter"], "")], bundle="demo")
    wait = ["wait", "--bundle", "dmeo", "--timeout", "0", "--status-dir", str(host.status)]
    code, out = cli(*wait)
    assert code == 3 and "the host has status for: demo" in out, out


def test_wait_does_not_call_active_a_generation_whose_load_failed_after_a_driver_less_boot(
    host: Layout, signed: dict[str, Path], kernel: str
) -> None:
    """v1 (two modules) active; a boot into another kernel loads nothing (``other_kernel``,
    no module recorded loaded); a boot back into v1's kernel whose kernel refuses one of its
    modules leaves nothing of it loaded (``failed``): ``wait`` for v1 exits 1 naming the
    failure, never 0 (the status file's record of live modules is empty, so only the phase
    says nothing is loaded)."""
    v1 = _failed_after_a_driver_less_boot(host, signed, kernel)
    code, out = cli(
        "wait",
        "--status-dir",
        str(host.status),
        "--bundle",
        "demo",
        "--generation",
        v1,
        "--timeout",
        "0",
        "--boot-id-file",
        str(host.boot_id),
    )
    assert code == 1 and f"generation {v1[:12]} could not be loaded" in out, out

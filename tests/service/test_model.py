"""A model-based stateful test: random sequences of drops, intake, the admin's verbs, daemon
scans and reboots on a real sandbox host, with what status must tell checked after every step.

Hypothesis' :class:`RuleBasedStateMachine` drives one sandbox root per example (built as
``tests.service.fakes.make_host`` builds every host tree) through the real commands
(``service.cli.main``: ``intake``, ``hold``, ``release``, ``retry``, ``rollback``,
``forget``, ``prune``, ``boot``, ``status``, ``wait``), the daemon's own steps
(:class:`~service.daemon.loop.Daemon`: ``reconcile``, ``take_drops``, ``maybe_reboot``) and
reboots: a new boot id, ``sys/module`` and ``run/`` emptied as a reboot empties them, then
``modstage boot``, or no boot at all (the unit did not run), or a boot whose kernel refuses one
module (:class:`~tests.service.fakes.FakeKernel`, the one loader that can fail an init), into
the kernel the modules are built for or another one. Nothing of the store, the state or the
verbs is faked. The drops: good ones, ones signed by a key the host does not trust (rejected),
ones for a kernel whose tree is not installed (they wait in incoming), and ones of a typo'd
bundle name carrying the real bundle's module.

Budget: the ``model-ci`` settings profile (the default here) runs 100 sequences of at most
40 steps, about a minute of the unit suite (47-62 s measured on the 2-core development
machine with another test run beside it); ``MODSTAGE_MODEL=long`` selects ``model-long``,
1,000 sequences of at most 60 steps, for a local run (docs/reliability.md has its time)::

    MODSTAGE_MODEL=long python3 -m pytest tests/service/test_model.py -q

A failure prints the shortest sequence of steps Hypothesis found (its ``state.…`` lines).
"""

from __future__ import annotations

import errno
import io
import json
import os
import shutil
import tempfile
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, ClassVar

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
    run_state_machine_as_test,
)

from service.boot.loader import Boot
from service.bundles.phase import Phase
from service.bundles.state import BundleState, State
from service.bundles.statefile import read
from service.cli import main
from service.cmd.host import Host
from service.daemon.loop import Daemon
from service.generations.store import Store
from service.host.running import RunningHost
from service.layout import Layout
from service.publish.labels import features_file
from service.status.collect import collect
from service.status.metrics import families
from stager.drop import ModuleSpec, stage
from stager.schema.statusfile import StatusFile
from tests.hosts import running_host
from tests.kmod import SigningKey, sign
from tests.service.fakes import FakeKernel, make_host

settings.register_profile(
    "model-ci",
    max_examples=100,
    stateful_step_count=40,
    deadline=None,
    derandomize=True,  # the same sequences on every CI run; model-long explores
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
settings.register_profile(
    "model-long",
    max_examples=1000,
    stateful_step_count=60,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
PROFILE = "model-long" if os.environ.get("MODSTAGE_MODEL") == "long" else "model-ci"

BUNDLES = ("demo", "dmeo")  # the real bundle and a typo'd name carrying the same modules
MODULE_SETS = {
    "exporter": ("ms_exporter",),
    "params": ("ms_params",),
    "pair": ("ms_exporter", "ms_consumer"),
}
OTHER_KERNEL = "6.99.0-model"  # no module tree installed: its drops wait in incoming
MAX_DROPS = 10


@dataclass(frozen=True)
class Kit:
    """What every example shares: signed modules (by a trusted and an untrusted key), the
    kernel they are built for, the trusted certificate, a directory for the roots."""

    trusted: dict[str, Path]
    untrusted: dict[str, Path]
    kernel: str
    cert: Path
    base: Path


@dataclass(frozen=True)
class Dropped:
    """A drop the model made: its directory, bundle and kind."""

    path: Path
    bundle: str
    kind: str


@dataclass
class ModelClock:
    """The daemon's clock: it moves only when the model says time passed."""

    wall: float = datetime(2026, 12, 1, 12, 0, tzinfo=UTC).timestamp()
    mono: float = 1000.0

    def now(self) -> datetime:
        """The model's wall time."""
        return datetime.fromtimestamp(self.wall, UTC)

    def monotonic(self) -> float:
        """The model's monotonic time."""
        return self.mono

    def wait(self, events: Any, timeout: float) -> None:
        """Never called: the model runs the daemon's steps itself."""
        raise AssertionError("the model drives the daemon's steps directly")

    def advance(self, seconds: float) -> None:
        """Let ``seconds`` pass."""
        self.wall += seconds
        self.mono += seconds


def cli(*argv: str) -> tuple[int, str]:
    """``modstage ARGV`` in this process: (exit code, stdout)."""
    out = io.StringIO()
    code = main(list(argv), out)
    return code, out.getvalue()


def module_names(store: Store, generation: str) -> set[str]:
    """The module names a stored generation loads."""
    return {m.name for m in store.manifest(generation).modules}


class HostModel(RuleBasedStateMachine):
    """One sandbox host; rules are what happens to a node, invariants what status tells."""

    kit: ClassVar[Kit]

    def __init__(self) -> None:
        super().__init__()
        self.dir = Path(tempfile.mkdtemp(dir=self.kit.base))
        self.layout = make_host(self.dir / "root", self.kit.kernel, self.kit.cert, {})
        features_file(self.layout).parent.mkdir(parents=True)
        self.root = str(self.layout.root)
        self.drops: list[Dropped] = []
        self.rejected: set[str] = set()  # names of the drops intake refused
        self.clock = ModelClock()
        self.daemon: Daemon | None = None
        self.booted = False  # modstage boot ran in this boot

    def teardown(self) -> None:
        """Remove the example's root."""
        shutil.rmtree(self.dir, ignore_errors=True)

    # -- helpers ---------------------------------------------------------------------------

    def state(self) -> State:
        """state.json as it is now (empty before the first intake)."""
        return read(self.layout.state) if self.layout.state.exists() else State()

    def running(self) -> str:
        """The running kernel's release."""
        return RunningHost.read(self.layout).need_release()

    def classify(self) -> None:
        """Note each drop intake refused (quarantined), once it has left incoming."""
        for d in self.drops:
            if not d.path.exists() and (self.layout.quarantine / d.path.name).exists():
                self.rejected.add(d.path.name)

    # -- rules -----------------------------------------------------------------------------

    @initialize(backend=st.sampled_from(["none", "kured"]))
    def configure(self, backend: str) -> None:
        """The host's reboot backend: an admin reboots, or kured asks the sentinel."""
        self.layout.config.write_text(f'[reboot]\nbackend = "{backend}"\n')

    @precondition(lambda self: len(self.drops) < MAX_DROPS)
    @rule(
        kind=st.sampled_from(["good", "good", "untrusted", "other-kernel"]),
        bundle=st.sampled_from(BUNDLES),
        modules=st.sampled_from(sorted(MODULE_SETS)),
        version=st.sampled_from(["1", "2", "3"]),
    )
    def drop(self, kind: str, bundle: str, modules: str, version: str) -> None:
        """A driver container stages a drop."""
        files = self.kit.untrusted if kind == "untrusted" else self.kit.trusted
        kernel = OTHER_KERNEL if kind == "other-kernel" else self.kit.kernel
        path = stage(
            self.layout.incoming,
            bundle=bundle,
            version=version,
            kernel=kernel,
            modules=[ModuleSpec(files[m], "") for m in MODULE_SETS[modules]],
        )
        self.drops.append(Dropped(path, bundle, kind))

    @rule()
    def intake(self) -> None:
        """``modstage intake`` by hand."""
        code, _ = cli("intake", "--root", self.root)
        assert code in (0, 1)
        self.classify()

    @precondition(lambda self: self.daemon is None)
    @rule()
    def daemon_starts(self) -> None:
        """The daemon starts (after a reboot, or restarted): it reconciles the boot id."""
        host = Host(self.layout)
        self.daemon = Daemon(self.layout, host.config, host.intake, host.rebooter, clock=self.clock)
        self.daemon.reconcile()

    @precondition(lambda self: self.daemon is not None)
    @rule(later=st.sampled_from([0.0, 120.0, 7200.0]))
    def daemon_scans(self, later: float) -> None:
        """One daemon pass: take drops in, let time pass, decide (and maybe ask) a reboot."""
        assert self.daemon is not None
        self.daemon.take_drops()
        self.clock.advance(later)
        self.daemon.maybe_reboot()
        self.daemon.write_metrics()
        self.classify()

    @rule(
        verb=st.sampled_from(["hold", "release", "retry", "rollback"]),
        bundle=st.sampled_from(BUNDLES),
    )
    def verb(self, verb: str, bundle: str) -> None:
        """An admin's verb on a bundle (refusals are fine; a traceback is not)."""
        code, _ = cli(verb, "--root", self.root, bundle)
        assert code in (0, 1, 2)

    @rule(verb=st.sampled_from(["retry", "rollback"]), data=st.data())
    def verb_on_generation(self, verb: str, data: st.DataObject) -> None:
        """``retry``/``rollback`` naming a generation the bundle knows."""
        known = [
            (n, g) for n, b in sorted(self.state().bundles.items()) for g in sorted(b.generations)
        ]
        if not known:
            return
        bundle, gen = data.draw(st.sampled_from(known))
        code, _ = cli(verb, "--root", self.root, bundle, gen[:12])
        assert code in (0, 1)

    @rule(bundle=st.sampled_from(BUNDLES))
    def retry_and_undo(self, bundle: str) -> None:
        """``retry`` then the undo docs/status.md names for it (``rollback B <active>``
        cancels the pending one): the bundle's failures, pending and phase are as before."""
        before = self.state().bundles.get(bundle)
        if before is None or before.active is None:
            return
        if cli("retry", "--root", self.root, bundle)[0] != 0:
            return
        after_retry = self.state().bundle(bundle)
        if after_retry.pending is None:  # the retry cancelled a pending rollback
            return
        code, _ = cli("rollback", "--root", self.root, bundle, before.active[:12])
        assert code == 0, f"retry of {bundle} cannot be undone"
        after = self.state().bundle(bundle)
        assert failures(after) == failures(before), "the undo lost a recorded failure"

    @rule(bundle=st.sampled_from(BUNDLES))
    def hold_and_release(self, bundle: str) -> None:
        """``hold`` then ``release`` leave the bundle as it was (but for history)."""
        before = self.state().bundles.get(bundle)
        if before is None or before.held:
            return
        assert cli("hold", "--root", self.root, bundle)[0] == 0
        assert cli("release", "--root", self.root, bundle)[0] == 0
        after = self.state().bundle(bundle)
        assert replace(after, history=()) == replace(before, history=())

    @rule(bundle=st.sampled_from(BUNDLES))
    def forget(self, bundle: str) -> None:
        """``forget``: a bundle with nothing live (no active generation) can always be
        removed, whatever it has pending."""
        b = self.state().bundles.get(bundle)
        code, _ = cli("forget", "--root", self.root, bundle)
        if b is not None and b.active is None:
            assert code == 0, f"{bundle} has nothing active, yet no verb removes it"

    @rule(keep=st.integers(0, 3))
    def prune(self, keep: int) -> None:
        """``prune --keep N``."""
        assert cli("prune", "--root", self.root, "--keep", str(keep))[0] == 0

    @rule(
        how=st.sampled_from(["boot", "boot", "no-boot", "failing-boot"]),
        kernel=st.sampled_from(["built-for", "built-for", "other"]),
        refused=st.sampled_from(sorted({m for ms in MODULE_SETS.values() for m in ms})),
    )
    def reboot(self, how: str, kernel: str, refused: str) -> None:
        """The node reboots: a new boot id, no module live, ``run/`` empty; then the boot."""
        layout = self.layout
        release = self.kit.kernel if kernel == "built-for" else OTHER_KERNEL
        running_host(layout, release, str(uuid.uuid4()))
        for live in (layout.sys / "module").iterdir():
            if live.name != "firmware_class":
                shutil.rmtree(live)
        for tmpfs in ("run", "var/run"):  # /run is a tmpfs (/var/run a link to it)
            shutil.rmtree(layout.root / tmpfs, ignore_errors=True)
        self.daemon, self.booted = None, False
        self.clock.advance(600.0)
        if how == "boot":
            code, _ = cli("boot", "--root", self.root)
            assert code in (0, 1)
            self.booted = True
        elif how == "failing-boot":
            host = Host(layout, salvage=True)
            kernel_ = FakeKernel(fail={refused: errno.ENOKEY}, sys=layout.sys)
            Boot(layout, host.config, lambda: host.trust, kernel_).run()
            self.booted = True

    @precondition(lambda self: self.booted)
    @rule()
    def boot_again(self) -> None:
        """``modstage boot`` run a second time in the same boot (a unit restarted by hand):
        every bundle keeps its phase, active and pending generation."""
        before = {n: (b.phase, b.active, b.pending) for n, b in self.state().bundles.items()}
        assert cli("boot", "--root", self.root)[0] in (0, 1)
        after = {n: (b.phase, b.active, b.pending) for n, b in self.state().bundles.items()}
        assert after == before

    # -- invariants ------------------------------------------------------------------------

    @invariant()
    def status_makes_one_decision(self) -> None:
        """Plain ``status``, ``status --json``, ``--reboot-required``, the status files, the
        metrics and the node labels agree: reboot required or not, the grade, each bundle's
        phase, active and pending generation."""
        required_code, _ = cli("status", "--root", self.root, "--reboot-required")
        assert required_code in (0, 1), "status --reboot-required cannot tell on a sandbox"
        _, raw = cli("status", "--root", self.root, "--json")
        doc = json.loads(raw)
        _, text = cli("status", "--root", self.root)
        head, reboot_line = text.splitlines()[:2]
        assert head.startswith(f"host: {grade_word(doc['health'])}"), (head, doc["health"])
        required = doc["reboot"]["required"]
        assert reboot_line.startswith("reboot: required" if required else "reboot: not required")
        if required_code == 0 and not required:  # only another tool's sentinel may ask
            sentinel = Path(doc["reboot"]["sentinel"]["path"])
            assert sentinel.exists() and not sentinel.read_text().startswith("modstage: "), (
                "kured is told to reboot, status says no reboot is required"
            )
        elif required and required_code == 1:
            why = doc["reboot"]["why_not_asked"] or ""
            assert "asked via" not in why and "due since" not in why, (
                f"status shows a reboot asked ({why}) while --reboot-required says none is"
            )
        report = collect(self.layout)
        metric = {f.name: f.samples for f in families(report)}["modstage_reboot_required"]
        assert metric == [({}, float(required))]
        state = self.state()
        labels = read_labels(self.layout)
        for name, b in state.bundles.items():
            shown = doc["bundles"][name]
            assert (shown["phase"], shown["active"], shown["pending"]) == (
                b.phase.value,
                b.active,
                b.pending,
            )
            status = StatusFile.read(self.layout.status / f"{name}.json")
            assert status is not None, f"{name} has no status file"
            assert (status.active, status.pending, status.held) == (b.active, b.pending, b.held)
            if labels is not None:
                assert labels.get(f"{name}.phase") == b.phase.value, (name, labels)

    @invariant()
    def wait_answers_only_for_live_generations(self) -> None:
        """``wait --drop D`` exits 0 only when D's generation has its modules live on the
        running kernel, and never for a drop that was rejected, whatever happened since."""
        state = self.state()
        store = Store(self.layout.store)
        for d in self.drops:
            code, out = cli(
                "wait",
                "--bundle",
                d.bundle,
                "--drop",
                str(d.path),
                "--timeout",
                "0",
                "--status-dir",
                str(self.layout.status),
                "--boot-id-file",
                str(self.layout.boot_id),
            )
            if d.path.name in self.rejected:
                assert code != 0, f"wait says a rejected drop is active: {out}"
            if code != 0:
                continue
            b = state.bundle(d.bundle)
            assert b.active is not None, out
            gen = b.generations[b.active]
            assert f"generation {gen.id[:12]} is active" in out, out
            assert gen.kernel == self.running(), f"{out} but it is for kernel {gen.kernel}"
            for name in module_names(store, gen.id):
                live = self.layout.sys / "module" / name / "initstate"
                assert live.exists(), f"{out} but {name} is not live"

    @invariant()
    def a_pending_generation_has_its_reboot(self) -> None:
        """A pending generation that can load on the running kernel, not held, not failed,
        is required a reboot for (or status says why not)."""
        _, raw = cli("status", "--root", self.root, "--json")
        doc = json.loads(raw)
        running = self.running()
        for name, b in self.state().bundles.items():
            gen = b.generations.get(b.pending) if b.pending else None
            if gen is None or gen.failed or b.held or gen.kernel != running:
                continue
            if b.pending == b.active and doc["bundles"][name]["phase"] == "active":
                continue  # the active one, pending again only once its modules left
            assert name in doc["reboot"]["bundles"] or doc["bundles"][name]["waiting"], (
                f"{name}: pending {gen.id[:12]} waits for a reboot nobody asks for "
                f"(phase {b.phase.value})"
            )

    @invariant()
    def a_driver_less_kernel_is_never_called_fine(self) -> None:
        """A bundle whose active generation targets another kernel than the running one has
        nothing loaded: status grades the host failed, and once ``modstage boot`` ran in
        this boot the bundle is ``other_kernel`` (or pending again, after a drop or a verb)
        in state, status file and labels, never ``active``."""
        running = RunningHost.read(self.layout).need_release()
        state = self.state()
        missing = [
            n
            for n, b in sorted(state.bundles.items())
            if b.active and b.generations[b.active].kernel != running
        ]
        if not missing:
            return
        _, raw = cli("status", "--root", self.root, "--json")
        assert json.loads(raw)["health"] == "failed", (missing, raw)
        if not self.booted:
            return
        labels = read_labels(self.layout)
        waits = (Phase.PENDING, Phase.REBOOT_SCHEDULED)  # a drop or a verb since the boot
        for name in missing:
            phase = state.bundle(name).phase
            assert phase is Phase.OTHER_KERNEL or phase in waits, (name, phase)
            doc = json.loads((self.layout.status / f"{name}.json").read_text())
            # (a drop refused since is the status file's own phase: the state's is unchanged)
            assert doc["phase"] in (phase.value, "rejected"), (name, doc["phase"], phase)
            if labels is not None:
                assert labels[f"{name}.phase"] == phase.value, (name, labels)

    @invariant()
    def no_two_bundles_claim_one_module(self) -> None:
        """Modules of the active and pending generations belong to one bundle each."""
        store = Store(self.layout.store)
        owner: dict[str, str] = {}
        for name, b in sorted(self.state().bundles.items()):
            for gen in sorted(b.keep()):
                for module in module_names(store, gen):
                    other = owner.setdefault(module, name)
                    assert other == name, f"{module} claimed by {other} and {name}"


def failures(b: BundleState) -> dict[str, str | None]:
    """Each generation's recorded failure."""
    return {g.id: g.failed for g in b.generations.values()}


def grade_word(health: str) -> str:
    """The word plain status starts with for a JSON health."""
    return "ok" if health == "healthy" else health.upper()


def read_labels(layout: Layout) -> dict[str, str] | None:
    """The node labels modstage wrote (prefix removed), None if it wrote none."""
    path = features_file(layout)
    if not path.exists():
        return None
    labels = {}
    for line in path.read_text().splitlines():
        if line.startswith("#") or "=" not in line:
            continue
        key, _, value = line.partition("=")
        labels[key.split("/", 1)[1]] = value
    return labels


@pytest.fixture
def kit(
    signed: dict[str, Path],
    modules: dict[str, Path],
    other_key: SigningKey,
    rsa_key: SigningKey,
    kernel: str,
    tmp_path: Path,
) -> Iterator[Kit]:
    """The modules signed by the trusted and an untrusted key, and a directory for roots."""
    (tmp_path / "untrusted").mkdir()
    untrusted = {
        n: sign(modules[n], other_key, tmp_path / "untrusted" / f"{n}.ko")
        for n in ("ms_exporter", "ms_params", "ms_consumer")
    }
    (tmp_path / "roots").mkdir()
    yield Kit(signed, untrusted, kernel, rsa_key.cert_pem, tmp_path / "roots")


def test_every_sequence_ends_in_a_state_status_tells_truthfully(kit: Kit) -> None:
    """Random sequences of drops, intake, verbs, daemon scans and reboots keep every
    invariant of :class:`HostModel` after every step; a failure prints the shortest
    sequence."""
    HostModel.kit = kit
    run_state_machine_as_test(HostModel, settings=settings.get_profile(PROFILE))

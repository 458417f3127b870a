"""The operator contract on the host: several incoming dirs, the config digest, status mirrors."""

from __future__ import annotations

import errno
import json
import threading
import time
from dataclasses import replace
from pathlib import Path

import pytest

from service.boot.loader import Boot
from service.boot.persist import Durable, Recorded
from service.bundles.phase import Phase
from service.bundles.state import BundleState, Generation
from service.bundles.statefile import load, save
from service.config import Config, Publish, RebootConfig
from service.daemon.events import Event, Kind
from service.daemon.loop import Daemon
from service.daemon.watcher import DropWatcher
from service.errors import ConfigError
from service.layout import Layout
from service.publish.operator import incoming_dirs, publish_digest, record_digest
from service.rebooting.request import CommandRebooter
from service.rebooting.window import Guard
from service.verify.signature.trust import TrustStore
from stager.drop import DIGEST_NAME, ModuleSpec, stage
from stager.schema.statusfile import StatusFile
from tests.kmod import SigningKey, sign
from tests.service.conftest import HostTree
from tests.service.fakes import FakeKernel, make_intake

A, B, C = "a" * 64, "b" * 64, "c" * 64
POD_IN = "/run/nvidia/modstage/incoming"
POD_STATUS = "/run/nvidia/modstage/status"
STATE_FILE = "/run/nvidia/nvidia-driver.state"
OPERATOR = Config(
    incoming_dirs=("/var/lib/modstage/incoming", POD_IN),
    publish=Publish(status_dirs=(POD_STATUS,), digest_files=(("nvidia", STATE_FILE),)),
)


@pytest.fixture
def host(host_tree: HostTree) -> Layout:
    """A host tree whose pod incoming directory exists (the daemon creates it)."""
    layout = host_tree()
    layout.host(POD_IN).mkdir(parents=True)
    return layout


@pytest.fixture
def signed(signed: dict[str, Path]) -> dict[str, Path]:
    """The signed test modules by the part they play: NVIDIA's two modules, and a bad one."""
    return {
        "nvidia": signed["ms_exporter"],
        "uvm": signed["ms_params"],
        "bad": signed["ms_firmware"],
    }


def _drop(
    host: Layout,
    signed: dict[str, Path],
    kernel: str,
    version: str,
    *,
    bad: bool = False,
    untrusted: Path | None = None,
    **kw: object,
) -> Path:
    second = ModuleSpec(signed["bad"]) if bad else ModuleSpec(signed["uvm"], f"label=v{version}")
    if untrusted is not None:  # signed by a key the host does not trust: refused at intake
        second = ModuleSpec(untrusted, f"label=v{version}")
    return stage(
        host.host(POD_IN),
        bundle="nvidia",
        version=version,
        kernel=kernel,
        modules=[ModuleSpec(signed["nvidia"]), second],
        **kw,
    )  # type: ignore[arg-type]


def _boot(host: Layout, kernel: FakeKernel) -> Boot:
    return Boot(host, OPERATOR, TrustStore.from_directory(host.trusted), kernel)


def test_config_reads_incoming_dirs_and_publish() -> None:
    """incoming_dirs and [publish] parse into values; the default keeps today's one directory."""
    assert Config().incoming_dirs == ("/var/lib/modstage/incoming",)
    cfg = Config.from_dict(
        {
            "incoming_dirs": ["/var/lib/modstage/incoming", POD_IN],
            "publish": {"status_dirs": [POD_STATUS], "digest_files": {"nvidia": STATE_FILE}},
        }
    )
    assert cfg == OPERATOR
    assert cfg.publish.digest_file("nvidia") == STATE_FILE
    assert cfg.publish.digest_file("other") is None


def test_config_refuses_relative_or_unnormalized_paths() -> None:
    """Every published or watched path is absolute and normalized; each problem is named."""
    with pytest.raises(ConfigError) as info:
        Config.from_dict(
            {
                "incoming_dirs": ["run/x", "/a/../b"],
                "publish": {"status_dirs": "/x", "digest_files": {"n": "/a/./b"}, "extra": 1},
            }
        )
    text = str(info.value)
    for part in (
        "incoming_dirs: 'run/x' is not an absolute",
        "incoming_dirs: '/a/../b' is not an absolute",
        "publish.status_dirs: '/x' is not an array of strings",
        "publish.digest_files.n: '/a/./b' is not an absolute",
        "publish.extra: unknown key",
    ):
        assert part in text
    with pytest.raises(ConfigError, match=r"incoming_dirs: \[\] names no directory"):
        Config.from_dict({"incoming_dirs": []})


def test_drop_in_the_pod_directory_is_taken_with_its_digest(
    host: Layout, signed: dict[str, Path], kernel: str
) -> None:
    """A drop under /run/nvidia is taken in; its digest recorded; the pod's status copy has it."""
    drop = _drop(host, signed, kernel, "1", config_digest="1234abcd")
    assert (drop / DIGEST_NAME).read_text() == "1234abcd\n"
    [outcome] = make_intake(host, OPERATOR).run()
    assert outcome.accepted, outcome.reasons
    assert not drop.exists()
    assert (host.config_digests / str(outcome.generation)).read_text() == "1234abcd\n"
    mirrored = json.loads((host.host(POD_STATUS) / "nvidia.json").read_text())
    assert mirrored["phase"] == "pending" and mirrored["pending"] == outcome.generation
    assert mirrored["generations"][outcome.generation] == {
        "version": "1",
        "kernel": kernel,
        "failed": None,
    }
    assert mirrored["running_kernel"] == kernel


def test_a_status_copy_names_the_kernel_running_now(
    host: Layout, signed: dict[str, Path], kernel: str
) -> None:
    """A bundle's status file written in an earlier boot keeps the kernel it was written
    under; its copy for the pod, mirrored after a reboot into another kernel, names the
    kernel that runs now (and every copy names the same one)."""
    from service.publish.operator import mirror_status
    from tests.hosts import KEEP, running_host

    _drop(host, signed, kernel, "1")
    [outcome] = make_intake(host, OPERATOR).run()
    assert outcome.accepted, outcome.reasons
    running_host(host, "6.99.0-after", KEEP)
    mirror_status(host, OPERATOR)
    own = json.loads((host.status / "nvidia.json").read_text())
    mirrored = json.loads((host.host(POD_STATUS) / "nvidia.json").read_text())
    assert (own["running_kernel"], mirrored["running_kernel"]) == (kernel, "6.99.0-after")


def test_a_directory_not_configured_is_not_read(
    host: Layout, signed: dict[str, Path], kernel: str
) -> None:
    """With the default config the pod directory is not an incoming directory at all."""
    drop = _drop(host, signed, kernel, "1")
    assert make_intake(host, Config()).run() == []
    assert drop.exists()


@pytest.mark.parametrize(
    ("content", "reason"),
    [
        (b"two words\n", "is not a config digest"),
        (b"\xff\xfe", "is not ASCII"),
        (b"x" * 600, "over the limit of 512"),
    ],
)
def test_a_bad_digest_rejects_the_drop(
    host: Layout, signed: dict[str, Path], kernel: str, content: bytes, reason: str
) -> None:
    """A digest file that is not one short printable word rejects the drop, naming the file."""
    drop = _drop(host, signed, kernel, "1", config_digest="ok")
    (drop / DIGEST_NAME).write_bytes(content)
    [outcome] = make_intake(host, OPERATOR).run()
    assert not outcome.accepted
    kept = host.quarantine / drop.name / DIGEST_NAME  # named where the quarantine keeps it
    assert f"{kept}:" in outcome.reasons[0] and reason in outcome.reasons[0]
    assert load(host.state).bundle("nvidia").phase is Phase.NONE


def test_a_symlinked_digest_is_refused(host: Layout, signed: dict[str, Path], kernel: str) -> None:
    """The digest file is read like every drop file: a symlink out of the drop is refused."""
    drop = _drop(host, signed, kernel, "1")
    (drop / DIGEST_NAME).symlink_to("/etc/hostname")
    [outcome] = make_intake(host, OPERATOR).run()
    assert not outcome.accepted and "is a symbolic link" in outcome.reasons[0]


def test_boot_writes_the_digest_of_the_live_generation(
    host: Layout, signed: dict[str, Path], kernel: str
) -> None:
    """Once live, the generation's digest is the state file's exact content (no newline)."""
    _drop(host, signed, kernel, "1", config_digest="digest-v1")
    [outcome] = make_intake(host, OPERATOR).run()
    state = _boot(host, FakeKernel()).run()
    assert state.bundle("nvidia").active == outcome.generation
    assert host.host(STATE_FILE).read_bytes() == b"digest-v1"
    mirrored = json.loads((host.host(POD_STATUS) / "nvidia.json").read_text())
    assert mirrored["phase"] == "active" and mirrored["active"] == outcome.generation


def test_after_a_failure_the_fallback_is_kept_under_the_failed_pods_digest(
    host: Layout, signed: dict[str, Path], kernel: str
) -> None:
    """v2 fails to load and v1 is brought back: the file names v2's digest, the one the v2
    driver pod still deployed carries, so its init container (which unloads whatever is
    loaded unless the file holds exactly its own digest) keeps v1; so does every plain
    reboot after. Reverting to v1 (its pod unloads v1, drops it again, one reboot) publishes
    v1's digest again, and a plain reboot keeps it: no reboot loop."""
    kernel_view = FakeKernel(sys=host.sys)
    _drop(host, signed, kernel, "1", config_digest="digest-v1")
    [first] = make_intake(host, OPERATOR).run()
    _boot(host, kernel_view).run()
    _drop(host, signed, kernel, "2", bad=True, config_digest="digest-v2")
    [second] = make_intake(host, OPERATOR).run()

    def reboot(fail: dict[str, int] | None = None) -> None:
        host.host(STATE_FILE).unlink(missing_ok=True)  # /run is empty after a reboot
        for name in list(kernel_view.live):
            kernel_view.unload(name)
        kernel_view.fail = fail or {}
        _boot(host, kernel_view).run()

    reboot({"ms_firmware": errno.ENODEV})
    b = load(host.state).bundle("nvidia")
    assert b.active == first.generation and b.deployed == second.generation
    assert b.generations[str(second.generation)].failed
    assert host.host(STATE_FILE).read_bytes() == b"digest-v2"
    mirrored = json.loads((host.host(POD_STATUS) / "nvidia.json").read_text())
    assert mirrored["generations"][second.generation]["failed"]
    reboot()  # a plain reboot: the v2 pod is still the deployed one
    assert load(host.state).bundle("nvidia").active == first.generation
    assert host.host(STATE_FILE).read_bytes() == b"digest-v2"

    for name in list(kernel_view.live):  # the reverted v1 pod's init container unloads v1
        kernel_view.unload(name)
    _drop(host, signed, kernel, "1", config_digest="digest-v1")
    [again] = make_intake(host, OPERATOR).run()
    assert again.generation == first.generation
    assert load(host.state).bundle("nvidia").pending == first.generation
    for _ in range(2):  # the reboot it asks, then a plain one
        reboot()
        b = load(host.state).bundle("nvidia")
        assert (b.active, b.pending, b.deployed) == (first.generation, None, first.generation)
        assert host.host(STATE_FILE).read_bytes() == b"digest-v1"


def test_a_failed_generation_without_a_digest_leaves_the_fallbacks_digest(
    host: Layout, signed: dict[str, Path], kernel: str
) -> None:
    """v2, staged by hand (its drop carried no digest), fails and v1 comes back: the file
    names v1's digest, so the v1 driver pod still deployed keeps v1."""
    _drop(host, signed, kernel, "1", config_digest="digest-v1")
    make_intake(host, OPERATOR).run()
    _boot(host, FakeKernel()).run()
    _drop(host, signed, kernel, "2", bad=True)
    [second] = make_intake(host, OPERATOR).run()
    host.host(STATE_FILE).unlink()  # /run is empty after the reboot
    state = _boot(host, FakeKernel(fail={"ms_firmware": errno.ENODEV})).run()
    assert state.bundle("nvidia").deployed == second.generation
    assert host.host(STATE_FILE).read_bytes() == b"digest-v1"


def _three_ways(layout: Layout) -> BundleState:
    """A active, C pending, B deployed (B failed at boot and A came back), each with a
    recorded digest (``digest-a``, ...)."""
    gens = {g: Generation(g, g[0], "k", added=n) for n, g in enumerate((A, B, C))}
    gens[B] = replace(gens[B], failed="ENODEV")
    for g in gens:
        record_digest(layout, g, f"digest-{g[0]}")
    bundle = BundleState(Phase.ACTIVE, active=A, pending=C, generations=gens, deployed=B)
    assert bundle.digest_generation(set(gens)) == B
    return bundle


def test_publish_digest_writes_the_digest_of_the_generation_the_state_names(
    tmp_path: Path,
) -> None:
    """With active, pending and deployed all different, the file holds the digest of
    :meth:`BundleState.digest_generation`: the deployed B's, and once B's digest is gone
    the active A's; never the pending C's."""
    layout = Layout(tmp_path)
    bundle = _three_ways(layout)
    assert publish_digest(layout, OPERATOR, "nvidia", bundle) == str(layout.host(STATE_FILE))
    assert layout.host(STATE_FILE).read_bytes() == b"digest-b"
    record_digest(layout, B, None)
    publish_digest(layout, OPERATOR, "nvidia", bundle)
    assert layout.host(STATE_FILE).read_bytes() == b"digest-a"
    assert publish_digest(layout, OPERATOR, "other", bundle) is None


def test_a_durable_boot_publishes_the_digest_the_state_names_a_dry_run_none(
    tmp_path: Path,
) -> None:
    """A real boot's :class:`Durable` writes the same digest as the state's method names
    (the deployed B's, with A active and C pending); a dry run's :class:`Recorded` writes
    nothing."""
    layout = Layout(tmp_path)
    bundle = _three_ways(layout)
    Recorded(layout, []).publish_digest("nvidia", bundle)
    assert not layout.host(STATE_FILE).exists()
    Durable(layout, OPERATOR).publish_digest("nvidia", bundle)
    assert layout.host(STATE_FILE).read_bytes() == b"digest-b"


def test_boot_publishes_the_deployed_digest_while_another_generation_is_pending(
    host: Layout, signed: dict[str, Path], kernel: str
) -> None:
    """v1 active, v2 failed at boot (its pod still deployed), v3 pending for another
    kernel: a reboot loads v1 and publishes v2's digest, as the state's method names, with
    active, pending and deployed all different."""
    _drop(host, signed, kernel, "1", config_digest="digest-v1")
    [first] = make_intake(host, OPERATOR).run()
    _boot(host, FakeKernel()).run()
    _drop(host, signed, kernel, "2", bad=True, config_digest="digest-v2")
    [second] = make_intake(host, OPERATOR).run()
    _boot(host, FakeKernel(fail={"ms_firmware": errno.ENODEV})).run()
    _drop(host, signed, kernel, "3", config_digest="digest-v3")
    [third] = make_intake(host, OPERATOR).run()
    state = load(host.state)
    b = state.bundle("nvidia")
    later = replace(b.generations[str(third.generation)], kernel="6.12.0-9-amd64")
    save(host.state, state.with_bundle("nvidia", b.with_generation(later)))
    host.host(STATE_FILE).unlink()  # /run is empty after the reboot
    b = _boot(host, FakeKernel()).run().bundle("nvidia")
    assert (b.active, b.pending, b.deployed) == (
        first.generation,
        third.generation,
        second.generation,
    )
    assert b.digest_generation({first.generation, second.generation, third.generation}) == (
        second.generation
    )
    assert host.host(STATE_FILE).read_bytes() == b"digest-v2"


def test_a_node_upgraded_after_a_failure_keeps_the_failed_pods_digest(
    host: Layout, signed: dict[str, Path], kernel: str
) -> None:
    """v2 failed at boot and v1 came back under a version that did not record
    ``deployed``: the state file is read with v2 deployed, so the next plain reboot
    publishes v2's digest (the v2 pod is still the one deployed) and records it."""
    _drop(host, signed, kernel, "1", config_digest="digest-v1")
    make_intake(host, OPERATOR).run()
    _boot(host, FakeKernel()).run()
    _drop(host, signed, kernel, "2", bad=True, config_digest="digest-v2")
    [second] = make_intake(host, OPERATOR).run()
    _boot(host, FakeKernel(fail={"ms_firmware": errno.ENODEV})).run()
    doc = json.loads(host.state.read_bytes())
    del doc["bundles"]["nvidia"]["deployed"]  # as saved before ``deployed`` existed
    host.state.write_text(json.dumps(doc))
    host.host(STATE_FILE).unlink()  # /run is empty after the reboot
    _boot(host, FakeKernel()).run()
    assert host.host(STATE_FILE).read_bytes() == b"digest-v2"
    saved = json.loads(host.state.read_bytes())["bundles"]["nvidia"]
    assert saved["deployed"] == second.generation


def test_generation_without_digest_leaves_no_state_file(
    host: Layout, signed: dict[str, Path], kernel: str
) -> None:
    """A live generation whose drop carried no digest removes a stale state file."""
    host.host(STATE_FILE).parent.mkdir(parents=True, exist_ok=True)
    host.host(STATE_FILE).write_text("stale")
    _drop(host, signed, kernel, "1")
    make_intake(host, OPERATOR).run()
    _boot(host, FakeKernel()).run()
    assert not host.host(STATE_FILE).exists()


def test_digests_of_forgotten_generations_are_removed(
    host: Layout, signed: dict[str, Path], kernel: str
) -> None:
    """Digest records follow state: a generation past ``retain`` loses its digest too."""
    cfg = Config(
        retain=1,
        incoming_dirs=OPERATOR.incoming_dirs,
        publish=OPERATOR.publish,
    )
    ids = []
    for version in ("1", "2", "3"):
        _drop(host, signed, kernel, version, config_digest=f"d{version}")
        [outcome] = make_intake(host, cfg).run()
        ids.append(outcome.generation)
    assert sorted(p.name for p in host.config_digests.iterdir()) == [ids[2]]


def test_daemon_watches_the_pod_directory_and_mirrors_the_reboot(
    host: Layout, signed: dict[str, Path], kernel: str
) -> None:
    """A drop under /run/nvidia is noticed by the drop watch, taken in, and the reboot shown to the pod."""
    asked: list[list[str]] = []
    cfg = replace(
        OPERATOR,
        reboot=RebootConfig(backend="command", command=("x",), guard=Guard(0, 3600)),
    )
    intake = make_intake(host, cfg)
    daemon = Daemon(
        host, cfg, intake, CommandRebooter(lambda: [["reboot-now"]], runner=asked.append)
    )
    host.incoming.mkdir(parents=True, exist_ok=True)
    daemon.watcher = DropWatcher(incoming_dirs(host, cfg), daemon.events)
    daemon.watcher.start()
    daemon.reconcile()
    thread = threading.Thread(target=daemon.loop, daemon=True)
    thread.start()
    try:
        time.sleep(0.5)  # the first scan found nothing; what follows must come from the watch
        _drop(host, signed, kernel, "1", config_digest="d1")
        mirror = host.host(POD_STATUS) / "nvidia.json"
        deadline = time.monotonic() + 20
        while not (
            asked  # the request follows the recorded intent and the status it shows
            and mirror.exists()
            and json.loads(mirror.read_text())["phase"] == "reboot_scheduled"
        ):
            assert time.monotonic() < deadline, "the pod never saw the reboot scheduled"
            time.sleep(0.05)
        assert asked == [["reboot-now"]]
        assert list(host.host(POD_IN).iterdir()) == []
    finally:
        daemon.events.put(Event(Kind.STOP))
        thread.join(timeout=10)
        daemon.watcher.stop()
    assert not thread.is_alive()


def test_the_active_generation_dropped_again_after_an_unload_is_pending_for_a_reboot(
    host: Layout, signed: dict[str, Path], kernel: str
) -> None:
    """A config-digest-only change: the init container unloaded the live generation and the
    pod drops the same modules with a new digest. The generation is pending again (a reboot
    is awaited), ``wait`` does not call it active, and the next boot loads it and publishes
    the new digest. While its modules are still loaded, the same drop changes nothing."""
    from stager.wait import Awaited, judge

    kernel_view = FakeKernel(sys=host.sys)
    _drop(host, signed, kernel, "1", config_digest="digest-a")
    [first] = make_intake(host, OPERATOR).run()
    _boot(host, kernel_view).run()
    gen = str(first.generation)
    _drop(host, signed, kernel, "1", config_digest="digest-a")
    [same] = make_intake(host, OPERATOR).run()  # a pod restart: still loaded, nothing to do
    b = load(host.state).bundle("nvidia")
    assert same.generation == gen and (b.phase, b.active, b.pending) == (Phase.ACTIVE, gen, None)

    for name in list(kernel_view.live):  # k8s-driver-manager: the digest differs, unload
        kernel_view.unload(name)
    drop = _drop(host, signed, kernel, "1", config_digest="digest-b")
    [again] = make_intake(host, OPERATOR).run()
    b = load(host.state).bundle("nvidia")
    assert again.generation == gen and (b.phase, b.active, b.pending) == (Phase.PENDING, gen, gen)
    assert load(host.state).awaiting_reboot(kernel) == ["nvidia"]
    mirror = StatusFile.read(host.host(POD_STATUS) / "nvidia.json")
    assert judge(mirror, Awaited(drop=drop.name, generation=gen)).code is None  # waits

    host.host(STATE_FILE).unlink()  # /run is empty after the reboot
    state = _boot(host, FakeKernel(sys=host.sys)).run()
    b = state.bundle("nvidia")
    assert (b.phase, b.active, b.pending) == (Phase.ACTIVE, gen, None)
    assert not b.generations[gen].failed and b.generations[gen].attempts == 0
    assert host.host(STATE_FILE).read_bytes() == b"digest-b"


def test_a_reloaded_generation_that_fails_at_boot_is_not_tried_twice(
    host: Layout, signed: dict[str, Path], kernel: str
) -> None:
    """The active generation pending again fails at boot: it is the failure, with no fallback
    (the fallback would be itself), loaded once, and no digest claims a config."""
    kernel_view = FakeKernel(sys=host.sys)
    _drop(host, signed, kernel, "1", config_digest="digest-a")
    [first] = make_intake(host, OPERATOR).run()
    _boot(host, kernel_view).run()
    for name in list(kernel_view.live):
        kernel_view.unload(name)
    _drop(host, signed, kernel, "1", config_digest="digest-b")
    make_intake(host, OPERATOR).run()
    host.host(STATE_FILE).unlink()
    failing = FakeKernel(fail={"ms_exporter": errno.ENODEV}, sys=host.sys)
    state = _boot(host, failing).run()
    b = state.bundle("nvidia")
    assert b.phase is Phase.FAILED and b.pending is None
    assert b.generations[str(first.generation)].failed
    assert [c for c in failing.calls if c[:2] == ("load", "ms_exporter")] == [
        ("load", "ms_exporter", "")
    ]
    assert not host.host(STATE_FILE).exists()


@pytest.fixture
def untrusted(modules: dict[str, Path], other_key: SigningKey, tmp_path: Path) -> Path:
    """The second module signed by a key the host does not trust (intake refuses it)."""
    return sign(modules["ms_params"], other_key, tmp_path / "ms_params.ko")


def _init_container(host: Layout, kernel_view: FakeKernel, digest: str | None) -> bool:
    """k8s-driver-manager's ``uninstall_driver`` (NVIDIA/k8s-driver-manager's driver-manager
    script; docs/rollout.md): with a driver loaded, it unloads it unless the digest file holds
    exactly the pod's digest (an unset one counts as changed). Whether it unloaded."""
    path = host.host(STATE_FILE)
    published = path.read_text().strip() if path.exists() else None
    if not kernel_view.live or (digest is not None and published == digest):
        return False
    for name in list(kernel_view.live):
        kernel_view.unload(name)
    return True


def _operator_daemon(host: Layout, asked: list[list[str]]) -> Daemon:
    cfg = replace(
        OPERATOR,
        reboot=RebootConfig(backend="command", command=("x",), guard=Guard(0, 3600)),
    )
    rebooter = CommandRebooter(lambda: [["reboot-now"]], runner=asked.append)
    return Daemon(host, cfg, make_intake(host, cfg), rebooter)


def _reboot(host: Layout, kernel_view: FakeKernel, boot: str) -> None:
    """A reboot: a new boot id, nothing loaded, /run empty, then ``modstage boot``."""
    host.boot_id.write_text(boot + "\n")
    host.host(STATE_FILE).unlink(missing_ok=True)
    for name in list(kernel_view.live):
        kernel_view.unload(name)
    _boot(host, kernel_view).run()


def test_a_refused_drop_after_the_unload_brings_the_last_good_back_under_its_pods_digest(
    host: Layout, signed: dict[str, Path], kernel: str, untrusted: Path
) -> None:
    """v1 runs; the v2 pod's init container unloads it (the digest differs) and its container
    drops v2, signed by a key the host does not trust. The drop is refused (quarantined, the
    status file says rejected with the reasons), v1 is pending again and the daemon asks one
    reboot; ``modstage boot`` loads v1 and publishes **v2's** digest, so the v2 pod's init
    container keeps v1 after the reboot. The pod restarting and dropping v2 again asks no
    other reboot, neither while v1 waits to be reloaded nor once it is live, and plain
    reboots keep v2's digest with v1 loaded: no reboot loop."""
    kernel_view = FakeKernel(sys=host.sys)
    asked: list[list[str]] = []
    daemon = _operator_daemon(host, asked)
    _drop(host, signed, kernel, "1", config_digest="digest-v1")
    [first] = daemon.take_drops()
    _boot(host, kernel_view).run()
    v1 = str(first.generation)

    assert _init_container(host, kernel_view, "digest-v2")  # the v2 pod: v1 unloaded
    drop = _drop(host, signed, kernel, "2", untrusted=untrusted, config_digest="digest-v2")
    [refused] = daemon.take_drops()
    assert not refused.accepted and "ENOKEY" in refused.reasons[0]
    assert not drop.exists() and (host.quarantine / drop.name).exists()
    status = json.loads((host.status / "nvidia.json").read_text())
    assert status["phase"] == "rejected" and status["errors"] == list(refused.reasons)
    b = load(host.state).bundle("nvidia")
    assert (b.phase, b.active, b.pending) == (Phase.PENDING, v1, v1)
    assert b.refused is not None and b.refused.digest == "digest-v2"
    assert b.refused.version == "2" and "ENOKEY" in b.refused.reason
    assert daemon.maybe_reboot().due and asked == [["reboot-now"]]

    assert not _init_container(host, kernel_view, "digest-v2")  # nothing loaded: no unload
    saved = host.state.read_bytes()
    _drop(host, signed, kernel, "2", untrusted=untrusted, config_digest="digest-v2")
    [again] = daemon.take_drops()  # the pod restarted while the reboot is scheduled
    assert not again.accepted and host.state.read_bytes() == saved
    assert not daemon.maybe_reboot().due and asked == [["reboot-now"]]

    _reboot(host, kernel_view, "boot-2")
    daemon.reconcile()
    b = load(host.state).bundle("nvidia")
    assert (b.phase, b.active, b.pending) == (Phase.ACTIVE, v1, None)
    assert host.host(STATE_FILE).read_bytes() == b"digest-v2"
    assert not _init_container(host, kernel_view, "digest-v2")  # the v2 pod keeps v1
    assert kernel_view.live
    _drop(host, signed, kernel, "2", untrusted=untrusted, config_digest="digest-v2")
    [after] = daemon.take_drops()
    b = load(host.state).bundle("nvidia")
    assert not after.accepted and (b.phase, b.pending) == (Phase.ACTIVE, None)
    assert load(host.state).awaiting_reboot(kernel) == []
    assert not daemon.maybe_reboot().due and asked == [["reboot-now"]]
    _reboot(host, kernel_view, "boot-3")  # a plain reboot: the v2 pod is still deployed
    assert host.host(STATE_FILE).read_bytes() == b"digest-v2"
    assert not _init_container(host, kernel_view, "digest-v2")


def test_the_refused_pods_wait_reads_the_refusal_after_the_reboot_is_asked(
    host: Layout, signed: dict[str, Path], kernel: str, untrusted: Path
) -> None:
    """The refused v2 pod's ``modstage wait --drop`` may first read the status file after
    the daemon rewrote it for the reboot that brings v1 back (phase reboot_scheduled, not
    rejected): it still exits 1 naming the refusal, never waits on as for a pending drop."""
    from stager.wait import EXIT_REFUSED, Awaited, judge

    kernel_view = FakeKernel(sys=host.sys)
    daemon = _operator_daemon(host, [])
    _drop(host, signed, kernel, "1", config_digest="digest-v1")
    daemon.take_drops()
    _boot(host, kernel_view).run()
    assert _init_container(host, kernel_view, "digest-v2")
    drop = _drop(host, signed, kernel, "2", untrusted=untrusted, config_digest="digest-v2")
    target = Awaited.from_drop(drop)
    [refused] = daemon.take_drops()
    assert not refused.accepted and daemon.maybe_reboot().due
    doc = StatusFile.from_json((host.status / "nvidia.json").read_bytes())
    assert doc.phase == Phase.REBOOT_SCHEDULED.value
    outcome = judge(doc, target)
    assert outcome.code == EXIT_REFUSED and outcome.message.startswith("drop rejected: ")
    assert "ENOKEY" in outcome.message and refused.reasons[0] in outcome.message


def test_a_refused_pod_that_unloads_the_reloaded_driver_again_asks_no_second_reboot(
    host: Layout, signed: dict[str, Path], kernel: str, untrusted: Path
) -> None:
    """The refused v2 drop carried no digest (no file to publish: the v2 pod's init
    container unloads whatever is loaded at every start). One reboot brings v1 back; when
    the restarted v2 pod unloads it again and drops v2 again, no other reboot is awaited
    (one per refused drop), and ``status`` says why nothing is reloaded."""
    from service.status.collect import collect

    kernel_view = FakeKernel(sys=host.sys)
    _drop(host, signed, kernel, "1", config_digest="digest-v1")
    make_intake(host, OPERATOR).run()
    _boot(host, kernel_view).run()
    assert _init_container(host, kernel_view, None)
    _drop(host, signed, kernel, "2", untrusted=untrusted)
    make_intake(host, OPERATOR).run()
    assert load(host.state).awaiting_reboot(kernel) == ["nvidia"]
    _reboot(host, kernel_view, "boot-2")
    assert not host.host(STATE_FILE).exists()  # the refused drop carried no digest
    assert _init_container(host, kernel_view, None)  # so the v2 pod unloads v1 again
    _drop(host, signed, kernel, "2", untrusted=untrusted)
    [refused] = make_intake(host, OPERATOR).run()
    assert not refused.accepted
    b = load(host.state).bundle("nvidia")
    assert b.phase is Phase.ACTIVE and load(host.state).awaiting_reboot(kernel) == []
    [reason] = [r for r in collect(host).bundles["nvidia"].reasons if "rejected" in r]
    assert "not reloaded again" in reason

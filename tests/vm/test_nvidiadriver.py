"""Driver pools under the GPU operator's NVIDIADriver objects: migration, moves, an
untrusted pool, a precompiled pool.

The node runs the operator's pod as tests/vm/test_operator.py runs it (pod.sh's mounts, the
init container and startup probe stand-ins, deploy/driver-container's ``nvidia-driver`` for
real, ``modstage serve`` and ``modstage boot`` on the host). What NVIDIADriver adds comes
from tests/vm/operator/nvidiadriver.py, each decision the operator's (v26.7.0, named there):
the owner label ``nvidia.com/gpu-operator.driver.owner``, one DaemonSet per pool named
``nvidia-<type>-driver-<os>-<hash>``, the pool's image and ``DRIVER_CONFIG_DIGEST`` (inputs
other than ClusterPolicy's: a migration changes every digest), and the Kubernetes DaemonSet
controller deleting the old pool's pod (preStop, then SIGTERM: the stock container unloads
the modules then, modstage's leaves them loaded, stager/driver.py) and starting the new
pool's pod (its init container first) once no other driver pod is on the node. The upgrade
controller is tests/vm/operator/upgrade_controller.py over the node's owner's DaemonSet; it
has no move logic. The node's NFD labels are its own (``/etc/os-release``, ``uname -r``).

One node (a module-scoped fixture), five boots, each path starting from the node the one
before leaves and failing at once, naming it, when that one did not pass:

1. ``test_first_install_under_cluster_policy`` (boot 2): v1 from the ClusterPolicy's
   DaemonSet, live with its digest, the pod ready.
2. ``test_migration_to_nvidiadriver`` (b): ``useNvidiaDriverCRD``: the ClusterPolicy's
   DaemonSet is deleted with orphan propagation, the node (owned by NVIDIADriver A, v1) is
   labelled upgrade-required and the controller walks it; A's pod unloads v1 (every digest
   changed), drops v1 again; one reboot (boot 3): v1 with A's digest, upgrade-done.
3. ``test_move_from_a_to_b`` (a, d): the node's pool label moves it to B (v2, precompiled:
   the kernel in its pool, DaemonSet hash and image tag; the image writes no digest file):
   A's pod deleted (v1 stays loaded), B's pod unloads v1 and drops v2; one reboot (boot 4):
   v2 with B's digest, ready; the upgrade state never left upgrade-done, no cordon.
4. ``test_precompiled_pod_restart_keeps_the_driver`` (d): B's pod deleted and started again:
   the host's digest file (written at boot, never by the image) keeps v2, ready in seconds.
5. ``test_move_to_an_untrusted_pool`` (c): the node moved to C, whose v3 is signed by a key
   the host does not trust: C's pod unloads v2, its drop is refused, v2 comes back by one
   reboot (boot 5) with C's digest published, so C's pod keeps it; C's container exits 1
   naming the rejection at every start and is never ready; no reboot is asked again;
   ``status``, the labels and the pod's log say why.

Each path's row (boots, upgrade state, driver-less time, staging, reboot) is printed as a
table once the node is done and written to ``<state share>/nvidiadriver.json``. Written for
6.1, as test_operator.py is, and for the same reason: no expectation differs by kernel.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from service.bundles.phase import Phase
from service.publish.labels import FILE_NAME
from tests.kmod import SigningKey, make_key
from tests.vm.harness import Vm, VmFactory
from tests.vm.harness.kernel import Kernel
from tests.vm.node import OPERATOR_CONFIG as CONFIG
from tests.vm.node import daemon_events, modstage, prepare, start_daemon, state, wait_until
from tests.vm.operator import container_env, init_container, make_image, nvidia_driver
from tests.vm.operator import startup_probe as probe_command
from tests.vm.operator.image import driver_rootfs, placed
from tests.vm.operator.nvidiadriver import (
    DEPLOY_DRIVER,
    GPU_PRESENT,
    KERNEL,
    ORPHANED,
    OS_ID,
    OS_VERSION,
    OWNER_LABEL,
    DaemonSet,
    NVIDIADriver,
    assign_owners,
    daemonsets,
    label_orphaned,
    pod_moves,
    selecting,
)
from tests.vm.operator.upgrade_controller import (
    RECONCILE_PERIOD,
    Action,
    Container,
    Pod,
    State,
    UpgradeController,
)

pytestmark = [pytest.mark.vm, pytest.mark.kernels("6.1")]
FEATURES = "/etc/kubernetes/node-feature-discovery/features.d"
STATE_FILE = "/run/nvidia/nvidia-driver.state"
READY = "/run/nvidia/validations/.driver-ctr-ready"
POOL = "example.com/gpu-pool"  # the admin's label that NVIDIADriver selectors use here
# The ClusterPolicy DaemonSet's DRIVER_CONFIG_DIGEST for v1 (test_operator.py's): its
# inputs are the whole rendered pod spec, so it is taken as given, not computed.
CP_DAEMONSET = "nvidia-driver-daemonset"
CP_DIGEST = "3520785164"
REGISTRY = "registry.example/nvidia"
# What makes the precompiled image write no digest file: its own run directory (the state
# file, its copy of the readiness file and the driver root go there, inside the container).
PRECOMPILED_ENV = {"RUN_DIR": "/tmp/image-run"}
DRIVERS = {  # three pools by the admin's label; B precompiled; C's image untrusted by the host
    "a": NVIDIADriver(
        "pool-a", "0d6e4079-e2b1-4a8a-9d7c-a1a1a1a1a1a1", REGISTRY, "driver", "1.0",
        node_selector={POOL: "a"}, kernel_module_config="kernel-module-params",
    ),
    "b": NVIDIADriver(
        "pool-b", "4c1f7f33-55b0-4f5e-8d2b-b2b2b2b2b2b2", REGISTRY, "driver", "2.0",
        node_selector={POOL: "b"}, kernel_module_config="kernel-module-params",
        use_precompiled=True,
    ),
    "c": NVIDIADriver(
        "pool-c", "9a7e2c61-0b8d-4e0e-a3c3-c3c3c3c3c3c3", REGISTRY, "driver", "3.0",
        node_selector={POOL: "c"}, kernel_module_config="kernel-module-params",
    ),
}  # fmt: skip
IMAGE_OF = {"1.0": "v1", "2.0": "v2", "3.0": "v3-untrusted"}  # the payload under images/


@pytest.fixture(scope="module")
def key(tmp_path_factory: pytest.TempPathFactory) -> SigningKey:
    """The driver vendor's module signing key (the host trusts its certificate)."""
    return make_key(tmp_path_factory.mktemp("nvkey"), "rsa4096", cn="driver vendor")


@pytest.fixture(scope="module")
def rogue(tmp_path_factory: pytest.TempPathFactory) -> SigningKey:
    """A key whose certificate the host does not trust: what someone who may edit an
    NVIDIADriver, but not the host, can sign an image with."""
    return make_key(tmp_path_factory.mktemp("roguekey"), "rsa4096", cn="pool owner")


@pytest.fixture(scope="module")
def rootfs(kernel: Kernel) -> Iterator[Path]:
    """The driver image's root file system built from deploy/driver-container."""
    with placed(driver_rootfs(kernel), kernel) as guest_path:
        yield Path(guest_path)


@pytest.fixture(scope="module")
def node(
    boot_vm: VmFactory, kernel: Kernel, key: SigningKey, rogue: SigningKey, rootfs: Path
) -> Iterator[Vm]:
    """A GPU node (boot 1) with v1 and v2 signed by the vendor, v3 by the rogue key."""
    vm = boot_vm("nvidiadriver")
    for version, signer in (("1.0", key), ("2.0", key), ("3.0", rogue)):
        make_image(vm.state_dir / "images" / IMAGE_OF[version], version, signer, {}, kernel)
    yield vm
    vm.close()


def _host_up(vm: Vm, key: SigningKey) -> None:
    """Every boot: NFD's features.d, the trusted certificate and config, ``modstage boot``,
    then ``modstage serve``."""
    vm.python(f"import os; os.makedirs({FEATURES!r}, exist_ok=True)")
    prepare(vm, {"vendor.pem": key.cert_pem.read_bytes()}, CONFIG)
    rc, out = modstage(vm, "boot")
    assert rc == 0, out
    log = start_daemon(vm, f"daemon-{vm.boots}.log")
    wait_until(
        lambda: any(e.get("event") == "daemon.ready" for e in daemon_events(log)),
        90,
        "daemon.ready",
    )


def _labels(vm: Vm) -> dict[str, str]:
    """modstage's node labels (``modstage.io/nvidia.*``) from NFD's feature file."""
    path = f"{FEATURES}/{FILE_NAME}"
    text = str(vm.eval(f"read({path!r}) if os.path.exists({path!r}) else ''"))
    pairs = (ln.split("=", 1) for ln in text.splitlines() if ln and not ln.startswith("#"))
    return {k.removeprefix("modstage.io/nvidia."): v for k, v in pairs}


def _labels_become(vm: Vm, expected: dict[str, str], keys: tuple[str, ...] = ()) -> None:
    """The labels named in ``expected`` (and ``keys``, present) reach their values."""

    def there() -> bool:
        now = _labels(vm)
        return all(now.get(k) == v for k, v in expected.items()) and all(k in now for k in keys)

    wait_until(there, 15, f"the labels {expected} and {keys}")


def _loaded(vm: Vm) -> str | None:
    version = vm.eval(
        "read('/sys/module/nvidia/version') if os.path.exists('/sys/module/nvidia') else None"
    )
    return None if version is None else str(version)


def _inode(vm: Vm, path: str) -> int | None:
    """The inode of ``path`` in the guest (a write by rename makes a new one)."""
    return vm.eval(f"os.stat({path!r}).st_ino if os.path.exists({path!r}) else None")


def _pending(vm: Vm, version: str) -> None:
    """``version`` pending with a reboot asked for."""

    def waiting() -> bool:
        b = state(vm).bundle("nvidia")
        gen = b.generations.get(b.pending) if b.pending else None
        return gen is not None and gen.version == version and b.phase is Phase.REBOOT_SCHEDULED

    wait_until(waiting, 120, f"v{version} pending with a reboot asked for")


def _says_refused(log: str) -> bool:
    """The container's last words name the refusal (``wait``: the drop's own rejection, or
    the refused generation in the status file's failed map)."""
    return "drop rejected" in log or "refused at intake" in log


def _os_labels(vm: Vm) -> dict[str, str]:
    """NFD's OS and kernel labels of the node, from its own /etc/os-release and release."""
    fields = dict(ln.split("=", 1) for ln in vm.read("/etc/os-release").splitlines() if "=" in ln)
    return {
        OS_ID: fields["ID"].strip('"'),
        OS_VERSION: fields["VERSION_ID"].strip('"'),
        KERNEL: vm.kernel.release,
    }


@dataclass(frozen=True)
class DriverPod:
    """The node's driver pod as the API server has it."""

    owner: str  # its DaemonSet's name, or ORPHANED
    revision: str  # controller-revision-hash
    version: str
    digest: str
    precompiled: bool = False

    @classmethod
    def of(cls, ds: DaemonSet) -> DriverPod:
        """The pod the DaemonSet ``ds`` starts."""
        return cls(ds.name, ds.revision, ds.version, ds.digest, ds.precompiled)


class Cluster:
    """One GPU node: its labels, the NVIDIADriver objects, the driver pod the kubelet runs
    and the DaemonSet controller and upgrade controller over it; what each path leaves for
    the next (the paths that passed, the table's rows)."""

    def __init__(self, vm: Vm, rootfs: Path) -> None:
        self.vm, self.rootfs = vm, rootfs
        self.labels = {GPU_PRESENT: "true", DEPLOY_DRIVER: "true", POOL: "a", **_os_labels(vm)}
        self.drivers: list[NVIDIADriver] = []  # none until the migration
        self.pod: DriverPod | None = DriverPod(CP_DAEMONSET, "cp-1.0", "1.0", CP_DIGEST)
        self.controller = UpgradeController("cp-1.0")
        self.clock = 0.0
        self.restarts = 0  # the driver container's restartCount in this pod
        self.running = False
        self.pods = 0
        self.results: list[dict[str, object]] = []
        self.passed: list[str] = []

    # -- the API server and the DaemonSet controller -----------------------------------------
    def daemonsets(self) -> dict[str, DaemonSet]:
        """Every pool's DaemonSet, the owner label patched first (AssignOwners)."""
        owner = assign_owners(self.drivers, {"node": self.labels}).get("node")
        if owner is None:
            self.labels.pop(OWNER_LABEL, None)
        else:
            self.labels[OWNER_LABEL] = owner
        return daemonsets(self.drivers, {"node": self.labels})

    def sync(self) -> tuple[bool, DaemonSet | None]:
        """The DaemonSet controller's pass over the node: the old pool's pod deleted (preStop,
        SIGTERM), the new pool's pod started; (deleted, the DaemonSet started)."""
        sets = self.daemonsets()
        delete, start = pod_moves(sets, self.labels, self.pod.owner if self.pod else None)
        if delete:
            self.stop()
            self.pod = None
        if start is not None:
            self.pod, self.restarts = DriverPod.of(start), 0
            self.controller.new_revision(start.revision)  # the node's owner's DaemonSet
        return delete, start

    def selected(self) -> DaemonSet:
        ds = selecting(self.daemonsets(), self.labels)
        assert ds is not None, self.labels
        return ds

    # -- the kubelet -------------------------------------------------------------------------
    def init_container(self) -> str:
        """The pod's init container (once per pod start, and after every node reboot)."""
        assert self.pod is not None
        result = self.vm.run(init_container(self.pod.digest), timeout=60)
        assert result.rc == 0, result.stdout + result.stderr
        return result.stdout

    def start(self) -> float:
        """Start the driver container in the background; when it started."""
        assert self.pod is not None
        self.pods += 1
        image = f"/var/lib/modstage/images/{IMAGE_OF[self.pod.version]}"
        extra = PRECOMPILED_ENV if self.pod.precompiled else {}
        env = container_env(self.pod.version, self.pod.digest, self.vm.kernel, **extra)
        command = "exec " + nvidia_driver(self.rootfs, image, env)
        self.vm.python("import subprocess")
        self.vm.eval(
            "globals().setdefault('pods', {}).__setitem__("
            f"'ctr', subprocess.Popen({command!r}, shell=True, "
            f"stdout=open('/var/lib/modstage/nvd-pod-{self.pods}.log', 'w'), "
            "stderr=subprocess.STDOUT))"
        )
        self.running = True
        return time.monotonic()

    def log(self) -> str:
        path = self.vm.state_dir / f"nvd-pod-{self.pods}.log"
        return path.read_text() if path.exists() else ""

    def exited(self) -> int | None:
        return self.vm.eval("pods['ctr'].poll()") if self.running else None

    def ended(self) -> int:
        """Wait for the container to end; its exit code (the kubelet restarts it)."""
        wait_until(lambda: self.exited() is not None, 120, f"the container ends: {self.log()}")
        code = self.exited()
        assert code is not None
        self.running = False
        self.restarts += 1
        return code

    def probe(self) -> bool:
        pid = int(self.vm.eval("pods['ctr'].pid"))
        command, script = probe_command(pid)
        return self.vm.run(command, input=script, timeout=30).rc == 0

    def ready_after(self, started: float, timeout: float = 60) -> float:
        wait_until(
            lambda: "; ready" in self.log() and self.probe(), timeout, f"ready: {self.log()}"
        )
        return time.monotonic() - started

    def stop(self) -> None:
        """Pod deletion or node shutdown: preStop removes the readiness file, then SIGTERM
        (killed after 30 s)."""
        if self.running:
            self.vm.python(
                f"os.remove({READY!r}) if os.path.exists({READY!r}) else None\n"
                "if pods['ctr'].poll() is None:\n"
                "    pods['ctr'].send_signal(15)\n"
                "    try:\n"
                "        pods['ctr'].wait(30)\n"
                "    except subprocess.TimeoutExpired:\n"
                "        pods['ctr'].kill(); pods['ctr'].wait()\n"
            )
        self.running = False

    def ready(self) -> bool:
        return bool(self.vm.eval(f"os.path.exists({READY!r})"))

    # -- the upgrade controller --------------------------------------------------------------
    def seen(self) -> Pod | None:
        if self.pod is None:
            return None
        ready = self.running and self.exited() is None and self.ready()
        revision = "orphaned" if self.pod.owner == ORPHANED else self.pod.revision
        return Pod(
            revision,
            True,
            (Container("nvidia-driver-ctr", ready, self.restarts),),
            (Container("k8s-driver-manager", True),),
        )

    def reconcile(self) -> list[Action]:
        self.clock += RECONCILE_PERIOD
        return self.controller.reconcile(self.clock, self.seen(), self.ready())

    def settle(self, most: int = 12) -> State:
        for _ in range(most):
            before = self.controller.state
            self.reconcile()
            if self.controller.state is before and before in (
                State.DONE,
                State.FAILED,
                State.POD_RESTART_REQUIRED,
            ):
                break
        return self.controller.state

    # -- the paths ---------------------------------------------------------------------------
    def after(self, path: str) -> None:
        if path not in self.passed:
            pytest.fail(
                f"this path starts from the node that {path!r} leaves, and {path!r} did not "
                "pass on this node: it failed, or it did not run",
                pytrace=False,
            )

    def record(self, path: str, boots: int, driverless: float | None, **more: object) -> None:
        self.results.append(
            {
                "path": path,
                "boots": boots,
                "state": str(self.controller.state),
                "driverless_s": driverless,
                **more,
            }
        )
        self.passed.append(path)


FIRST = "first install (ClusterPolicy)"
PATHS = (
    FIRST,
    "(b) ClusterPolicy -> NVIDIADriver",
    "(a) move A (v1) -> B (v2, precompiled)",
    "(d) precompiled pod restart",
    "(c) move B -> C (untrusted v3)",
)


@pytest.fixture(scope="module")
def cluster(node: Vm, rootfs: Path) -> Iterator[Cluster]:
    """The node's pod, controllers and objects, carried from path to path; then the table."""
    started = time.monotonic()
    c = Cluster(node, rootfs)
    yield c
    _print_and_write(c, node, time.monotonic() - started)


def _print_and_write(c: Cluster, vm: Vm, took: float) -> None:
    """The table of the paths that passed, printed and as JSON on the state share."""
    print(
        f"\nNVIDIADriver paths ({vm.kernel.series} guest, {vm.machine.accel.upper()}, "
        f"{vm.boots} boots in {took:.0f} s):"
    )
    print(f"{'path':<40} {'boots':>5} {'upgrade state':<16} {'driver-less':>11}  detail")
    for r in c.results:
        d = r["driverless_s"]
        shown = "none" if d == 0 else f"{d:.0f} s"
        detail = ", ".join(
            f"{k} {v}" for k, v in r.items() if k not in ("path", "boots", "state", "driverless_s")
        )
        print(f"{r['path']:<40} {r['boots']:>5} {r['state']:<16} {shown:>11}  {detail}")
    if c.passed != list(PATHS):
        print(f"not every path passed (passed: {', '.join(c.passed) or 'none'}): partial table")
    doc = {
        "kernel": vm.kernel.release,
        "boots": vm.boots,
        "seconds": round(took),
        "paths": c.results,
    }
    target = vm.state_dir / "nvidiadriver.json"
    target.write_text(json.dumps(doc, indent=1) + "\n")
    print(f"results: {target}")
    if os.environ.get("MODSTAGE_NVIDIADRIVER_RESULTS") and c.passed == list(PATHS):
        Path(os.environ["MODSTAGE_NVIDIADRIVER_RESULTS"]).write_text(json.dumps(doc, indent=1))


def test_first_install_under_cluster_policy(cluster: Cluster, node: Vm, key: SigningKey) -> None:
    """Before any NVIDIADriver: the ClusterPolicy's pod stages v1, the host reboots the node
    (boot 2) and loads v1 with the ClusterPolicy's digest; the pod keeps it and is ready."""
    _host_up(node, key)
    assert "no nvidia driver loaded" in cluster.init_container()
    cluster.start()
    _pending(node, "1.0")
    assert cluster.settle() is State.DONE
    cluster.stop()
    node.reboot()
    _host_up(node, key)
    assert _loaded(node) == "1.0" and node.read(STATE_FILE) == CP_DIGEST
    assert "skipping the unload" in cluster.init_container()
    cluster.ready_after(cluster.start())
    assert cluster.settle() is State.DONE
    cluster.passed.append(FIRST)


def test_migration_to_nvidiadriver(cluster: Cluster, node: Vm, key: SigningKey) -> None:
    """``useNvidiaDriverCRD`` with NVIDIADriver A (v1, the node's pool) costs the node one
    reboot and no longer driver-less than the staging and that reboot: A's digest differs
    from the ClusterPolicy's (other inputs), the orphaned pod's node is labelled
    upgrade-required and walked (cordon, the orphaned pod deleted: no DaemonSet controller
    does it), A's pod unloads v1 and drops it again, the host asks one reboot (boot 3) and
    loads v1 with A's digest: A's pod keeps it, ready, upgrade-done, uncordoned.

    Starts from the node test_first_install_under_cluster_policy leaves."""
    cluster.after(FIRST)
    cluster.drivers = [DRIVERS["a"], DRIVERS["b"], DRIVERS["c"]]
    assert cluster.pod is not None
    cluster.pod = DriverPod(ORPHANED, "orphaned", "1.0", CP_DIGEST)  # its DaemonSet deleted
    assert cluster.sync() == (False, None)  # the orphan stays; its anti-affinity blocks A's pod
    ds_a = cluster.selected()
    assert cluster.labels[OWNER_LABEL] == "pool-a" and ds_a.owner == "pool-a"
    assert ds_a.name.startswith(f"nvidia-gpu-driver-{ds_a.image.rsplit('-', 1)[1]}-")
    assert ds_a.digest != CP_DIGEST  # every digest changes
    cluster.controller.new_revision(ds_a.revision)
    assert label_orphaned(str(cluster.controller.state))
    cluster.controller.state = State.UPGRADE_REQUIRED  # nodelabeling_controller.go
    for _ in range(10):
        if Action.DELETE_DRIVER_POD in cluster.reconcile():
            break
    else:
        raise AssertionError(f"the controller never deleted the pod: {cluster.controller}")
    assert cluster.controller.cordoned
    cluster.stop()
    cluster.pod = None
    assert cluster.sync()[1] == ds_a  # A's pod starts: init container first
    changed = cluster.init_container()
    assert "driver config changed" in changed and "unloaded nvidia" in changed, changed
    t_unload = time.monotonic()
    assert _loaded(node) is None
    cluster.start()
    _pending(node, "1.0")  # the same generation again, with A's digest: pending, reboot asked
    t_asked = time.monotonic()
    _labels_become(node, {"phase": "reboot_scheduled", "active": "1.0", "pending": "1.0"})
    assert cluster.settle() is State.POD_RESTART_REQUIRED
    cluster.stop()
    t_down = time.monotonic()
    node.reboot()
    _host_up(node, key)
    t_loaded = time.monotonic()
    assert _loaded(node) == "1.0" and node.read(STATE_FILE) == ds_a.digest
    kept = cluster.init_container()
    assert "skipping the unload" in kept and "unloaded" not in kept, kept
    ready = cluster.ready_after(cluster.start())
    assert cluster.settle() is State.DONE and not cluster.controller.cordoned
    _labels_become(node, {"phase": "active", "active": "1.0", "pending": ""})
    assert t_asked - t_unload < 60, "staging takes seconds: the reboot is the driver-less time"
    cluster.record(
        PATHS[1],
        1,
        round(t_loaded - t_unload, 1),
        staging_s=round(t_asked - t_unload, 1),
        reboot_s=round(t_loaded - t_down, 1),
        ready_s=round(ready, 1),
    )


def test_move_from_a_to_b(cluster: Cluster, node: Vm, key: SigningKey) -> None:
    """The node's pool label moves it from A (v1) to B (v2, precompiled): the owner label
    follows, the DaemonSet controller deletes A's pod (SIGTERM: modstage's container leaves
    v1 loaded), B's pod (its DaemonSet and image named with the node's kernel) unloads v1
    (A's digest on file) and drops v2; one reboot (boot 4): v2 with B's digest, which the
    image never writes (the host's file, untouched while B's pod becomes ready), B's pod
    ready. The upgrade controller takes no part: upgrade-done throughout, no cordon.

    Starts from the node test_migration_to_nvidiadriver leaves: v1 live with A's pod."""
    cluster.after(PATHS[1])
    history = list(cluster.controller.history)
    cluster.labels[POOL] = "b"
    deleted, ds_b = cluster.sync()
    assert deleted and ds_b is not None and cluster.labels[OWNER_LABEL] == "pool-b"
    assert "the nvidia modules stay loaded" in cluster.log() and _loaded(node) == "1.0"
    release, os_tag = node.kernel.release, ds_b.image.rsplit("-", 1)[1]
    assert ds_b.precompiled and ds_b.image == f"{REGISTRY}/driver:2.0-{release}-{os_tag}"
    changed = cluster.init_container()
    assert "driver config changed" in changed and "unloaded nvidia" in changed, changed
    t_unload = time.monotonic()
    cluster.start()
    _pending(node, "2.0")
    t_asked = time.monotonic()
    _labels_become(node, {"phase": "reboot_scheduled", "active": "1.0", "pending": "2.0"})
    assert cluster.settle() is State.DONE and cluster.controller.history == history
    assert not cluster.controller.cordoned and not cluster.ready()  # done, yet unready
    cluster.stop()
    t_down = time.monotonic()
    node.reboot()
    _host_up(node, key)
    t_loaded = time.monotonic()
    assert _loaded(node) == "2.0" and node.read(STATE_FILE) == ds_b.digest
    written = _inode(node, STATE_FILE)
    kept = cluster.init_container()
    assert "skipping the unload" in kept and "unloaded" not in kept, kept
    ready = cluster.ready_after(cluster.start())
    assert _inode(node, STATE_FILE) == written, "the precompiled image wrote the digest file"
    assert cluster.settle() is State.DONE and cluster.controller.history == history
    _labels_become(node, {"phase": "active", "active": "2.0", "pending": ""})
    cluster.record(
        PATHS[2],
        1,
        round(t_loaded - t_unload, 1),
        staging_s=round(t_asked - t_unload, 1),
        reboot_s=round(t_loaded - t_down, 1),
        ready_s=round(ready, 1),
    )


def test_precompiled_pod_restart_keeps_the_driver(cluster: Cluster, node: Vm) -> None:
    """B's pod deleted and started again (no change): the digest file the host wrote at boot
    (the image writes none) makes the init container keep v2; ready within a minute, no
    reboot, nothing unloaded, the file untouched.

    Starts from the node test_move_from_a_to_b leaves: v2 live with B's pod ready."""
    cluster.after(PATHS[2])
    written = _inode(node, STATE_FILE)
    cluster.stop()
    assert "the nvidia modules stay loaded" in cluster.log() and _loaded(node) == "2.0"
    cluster.pod = None
    assert cluster.sync()[1] is not None
    kept = cluster.init_container()
    assert "skipping the unload" in kept and "unloaded" not in kept, kept
    ready = cluster.ready_after(cluster.start())
    assert ready < 60 and _loaded(node) == "2.0" and _inode(node, STATE_FILE) == written
    assert state(node).bundle("nvidia").pending is None and cluster.settle() is State.DONE
    cluster.record(PATHS[3], 0, 0.0, ready_s=round(ready, 1))


def test_move_to_an_untrusted_pool(cluster: Cluster, node: Vm, key: SigningKey) -> None:
    """The node moved to C, whose v3 is signed by a key the host does not trust: C's pod
    unloads v2, its drop is refused (quarantined, ``rejected``), the host brings v2 back by
    one reboot (boot 5) and publishes C's digest, so C's pod keeps v2. C's container exits 1
    naming the rejection at every start, before and after the reboot, and is never ready;
    the host asks no further reboot; ``status``, the labels and the pod's log say why. The
    upgrade controller has no move logic (the node reads upgrade-done); had C's v3 come as
    an upgrade instead, the node's 11th restart would make it upgrade-failed and, with
    maxParallelUpgrades 1, no other node would start.

    Starts from the node test_precompiled_pod_restart_keeps_the_driver leaves: v2 live,
    B's pod ready."""
    cluster.after(PATHS[3])
    cluster.labels[POOL] = "c"
    deleted, ds_c = cluster.sync()
    assert deleted and ds_c is not None and cluster.labels[OWNER_LABEL] == "pool-c"
    assert _loaded(node) == "2.0"
    changed = cluster.init_container()
    assert "driver config changed" in changed and "unloaded nvidia" in changed, changed
    t_unload = time.monotonic()
    cluster.start()
    assert cluster.ended() == 1 and _says_refused(cluster.log()), cluster.log()
    _pending(node, "2.0")  # v2 pending again: the reboot that brings it back
    t_asked = time.monotonic()
    b = state(node).bundle("nvidia")
    assert b.pending == b.active and b.refused is not None and b.refused.version == "3.0"
    _labels_become(
        node, {"phase": "reboot_scheduled", "active": "2.0", "pending": "2.0"}, ("rejected",)
    )
    cluster.start()  # the kubelet restarts it: the same drop, refused again, changes nothing
    assert cluster.ended() == 1 and _says_refused(cluster.log()), cluster.log()
    again = state(node).bundle("nvidia")
    assert (again.phase, again.pending, again.refused) == (b.phase, b.pending, b.refused)
    cluster.stop()
    t_down = time.monotonic()
    node.reboot()
    _host_up(node, key)
    t_loaded = time.monotonic()
    assert _loaded(node) == "2.0" and node.read(STATE_FILE) == ds_c.digest
    kept = cluster.init_container()
    assert "skipping the unload" in kept and "unloaded" not in kept, kept
    runs = []
    for _ in range(2):
        started = cluster.start()
        assert cluster.ended() == 1 and _says_refused(cluster.log()), cluster.log()
        runs.append(time.monotonic() - started)
        b = state(node).bundle("nvidia")
        assert (b.phase, b.pending) == (Phase.ACTIVE, None), "a reboot was asked again"
        assert _loaded(node) == "2.0" and not cluster.ready()
    labels = _labels(node)
    assert (labels["phase"], labels["active"], labels["pending"]) == ("active", "2.0", ""), labels
    assert labels.get("rejected"), labels
    _rc, plain = modstage(node, "status")
    assert "was rejected" in plain and "3.0" in plain, plain
    assert cluster.settle() is State.DONE  # in sync, never ready: the controller sees nothing
    # the same unready pod as an upgrade of C's nodes: upgrade-failed, and the rollout halts
    judged = UpgradeController("old", State.POD_RESTART_REQUIRED, max_parallel=1)
    judged.new_revision(ds_c.revision)
    unready = Pod(ds_c.revision, True, (Container("nvidia-driver-ctr", False, 11),))
    judged.reconcile(0.0, unready, False)
    other = UpgradeController("old", State.UPGRADE_REQUIRED, max_parallel=1, others_in_progress=1)
    other.reconcile(0.0, Pod("old", True, (Container("nvidia-driver-ctr", True),)), True)
    assert judged.state is State.FAILED and other.state is State.UPGRADE_REQUIRED
    cluster.record(
        PATHS[4],
        1,
        round(t_loaded - t_unload, 1),
        staging_s=round(t_asked - t_unload, 1),
        reboot_s=round(t_loaded - t_down, 1),
        container_run_s=round(sum(runs) / len(runs), 1),
    )

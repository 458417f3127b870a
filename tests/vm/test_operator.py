"""Driver rollouts under the NVIDIA GPU operator's pod and its upgrade controller, unchanged.

The pod is simulated in the guest with the mounts of the operator's driver DaemonSet
(tests/vm/operator/pod.sh), its init container by a stand-in applying k8s-driver-manager's
uninstall_driver decision (uninstall_driver.sh), its startup probe by startup_probe.sh; the
driver container runs deploy/driver-container's ``nvidia-driver`` (stager.driver). The
operator's upgrade controller is tests/vm/operator/upgrade_controller.py, fed with what the
test sees of the pod (revision, readiness, restarts); the test carries out what it does
(deleting the driver pod; the DaemonSet's OnDelete strategy then starts the new one). The
host runs ``modstage serve`` with the pod's directory in ``incoming_dirs``, ``modstage
boot`` at every boot, and node-feature-discovery's ``features.d`` exists (the labels are
read after every step). One test per rollout path, in this order, over one node (a
module-scoped fixture) that boots seven times in all; each path starts from the node the one
before leaves, says so, and fails at once naming that path when it did not pass:

1. ``test_first_install``: a fresh node refuses an image for another kernel at once,
   stages v1 and reboots (boot 2); v1 is live and its pod ready.
2. ``test_pod_restart_with_no_change``: nothing is unloaded, the pod is ready within
   seconds.
3. ``test_v1_to_v2``: the controller walks to pod-restart-required and deletes the pod;
   the new pod's init container unloads v1 (the driver-less time starts), v2 is staged;
   reboot (boot 3): v2 live, the pod ready, upgrade-done.
4. ``test_node_reboot_with_no_change`` (boot 4): v2 loaded by ``modstage boot``, the init
   container keeps it, ready within seconds.
5. ``test_closed_window_holds_a_digest_only_change``: a digest-only change (same modules
   and parameters) while the reboot window is closed (kured backend, the window opening in
   5 hours): the init container unloads v2, the pod drops the same generation, the host
   makes it pending again and asks no reboot (kured's sentinel says "not required"); the
   pod waits unready, the controller stays pod-restart-required; the startup probe's
   restarts over that wait are none with the probe deploy/README.md sizes and over 10
   (upgrade-failed) with the default. The window opens (the admin's config here) and the
   host asks the reboot.
6. ``test_digest_only_change`` (boot 5): v2 loaded again with the new digest, kept, ready:
   upgrade-done.
7. ``test_v3_failing_at_boot_falls_back_to_v2``: v2 -> v3 (whose nvidia-uvm fails at
   init) is staged; reboot (boot 6): v3 fails and v2 is loaded again, with v3's digest
   published, so the v3 pod's init container keeps v2. The v3 container fails twice, says
   why, asks no reboot, is never ready; the controller marks the node upgrade-failed on
   the 11th restart. The labels and ``status`` name the failure.
8. ``test_revert_to_v2_after_v3_failed``: ClusterPolicy back at v2, the failed node's pod
   deleted by hand (the controller deletes none in upgrade-failed); the v2 pod's init
   container unloads v2 (the digest is v3's) and the host asks a reboot (boot 7): v2 loaded
   with its own digest, kept, ready: upgrade-done (no reboot loop).

Each path's upgrade state and driver-less time are printed as a table once the node is done
and written to ``<state share>/rollout.json`` (the paths that passed), and on 6.1 to
``$MODSTAGE_ROLLOUT_RESULTS`` when set and every path passed, for bench/rollout
(bench/rollout-measured.json is a 6.1 run's: the 6.12 run's figures stay on its share).

Written for 6.1 (``kernels("6.1")``); the fixtures also build a 6.12 node (Debian 13's kernel
in its own root) for a run by hand with the marker widened. The fake NVIDIA modules are built
against the node kernel's headers and signed with its sign-file, and the driver image is built
for the node's kernel (its ``KERNEL_VERSION`` and module directory); the image is Debian 12
(the pod's user space, chrooted in the guest's pod namespace). No expectation differs between
kernels: nothing here touches compressed modules, memory hotplug or ECDSA, where they differ,
and the real ``nvidia`` of each kernel's release is loaded by tests/vm/test_devices.py on 6.1
and 6.12.
"""

from __future__ import annotations

import copy
import json
import os
import time
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any, NamedTuple

import pytest

from service.bundles.phase import Phase
from service.publish.labels import FILE_NAME
from tests.kmod import SigningKey, make_key
from tests.vm.harness import Vm, VmFactory
from tests.vm.harness.kernel import Kernel
from tests.vm.node import OPERATOR_CONFIG as CONFIG
from tests.vm.node import daemon_events, live_modules, modstage, prepare, start_daemon, state
from tests.vm.node import wait_until as _wait_until
from tests.vm.operator import (
    container_env,
    init_container,
    make_image,
    nvidia_driver,
    startup_probe,
)
from tests.vm.operator.image import driver_rootfs, placed
from tests.vm.operator.upgrade_controller import (
    RECONCILE_PERIOD,
    Action,
    Container,
    Pod,
    State,
    UpgradeController,
    restarts_while_waiting,
)

pytestmark = [pytest.mark.vm, pytest.mark.kernels("6.1")]
NV = ("nvidia", "nvidia_modeset", "nvidia_uvm")
# DRIVER_CONFIG_DIGEST per ClusterPolicy; "2.0-b" is v2 again after an install-irrelevant change
DIGEST = {"1.0": "3520785164", "2.0": "1177712841", "2.0-b": "4025513990", "3.0": "2846122119"}
FEATURES = "/etc/kubernetes/node-feature-discovery/features.d"
KURED_PERIOD = 60.0  # deploy/kubernetes/kured-daemonset.yaml: --period=1m


@pytest.fixture(scope="module")
def key(tmp_path_factory: pytest.TempPathFactory) -> SigningKey:
    """NVIDIA's module signing key in this test (the host trusts its certificate)."""
    return make_key(tmp_path_factory.mktemp("nvkey"), "rsa4096", cn="driver vendor")


@pytest.fixture(scope="module")
def rootfs(kernel: Kernel) -> Iterator[Path]:
    """The driver image built from deploy/driver-container for the node's kernel (its root
    file system), where the node sees it."""
    with placed(driver_rootfs(kernel), kernel) as guest_path:
        yield Path(guest_path)


@pytest.fixture(scope="module")
def node(boot_vm: VmFactory, kernel: Kernel, key: SigningKey, rootfs: Path) -> Iterator[Vm]:
    """A GPU node with each version's payload, built for its kernel, on its state share (the
    pod binds them)."""
    vm = boot_vm("operator")
    params = {"1.0": {"nvidia": "fail=0"}, "2.0": {}, "3.0": {"nvidia-uvm": "fail=1"}}
    for version, conf in params.items():
        make_image(vm.state_dir / "images" / version, version, key, conf, kernel)
    yield vm
    vm.close()


def _version(revision: str) -> str:
    return revision.split("-")[0]


def _driver(vm: Vm, rootfs: Path, revision: str, verb: str = "init", **env: str) -> str:
    """``nvidia-driver VERB`` in the pod of ``revision`` (a version, or version-variant) on
    ``vm``'s kernel."""
    version = _version(revision)
    image = f"/var/lib/modstage/images/{version}"
    environment = container_env(version, DIGEST[revision], vm.kernel, **env)
    return nvidia_driver(rootfs, image, environment, verb)


def _host_up(vm: Vm, key: SigningKey) -> Path:
    """What the node does at every boot: config, ``modstage boot``, then the daemon (NFD's
    features.d exists: the operator deploys node-feature-discovery)."""
    vm.python(f"import os; os.makedirs({FEATURES!r}, exist_ok=True)")
    prepare(vm, {"vendor.pem": key.cert_pem.read_bytes()}, CONFIG)
    rc, out = modstage(vm, "boot")
    assert rc == 0, out
    log = start_daemon(vm, f"daemon-{vm.boots}.log")
    _wait_until(
        lambda: any(e.get("event") == "daemon.ready" for e in daemon_events(log)),
        90,
        "daemon.ready",
    )
    return log


def _closed_window() -> str:
    """The config with kured as the backend and a daily window that opens in 5 hours (the
    guest's clock is the host's, UTC): the sentinel answers "not required" until then."""
    opens = datetime.now(UTC) + timedelta(hours=5)
    days = '["mon", "tue", "wed", "thu", "fri", "sat", "sun"]'
    return CONFIG.replace(
        'backend = "none"',
        f'backend = "kured"\nsentinel = "/run/modstage/reboot-required"\ndays = {days}\n'
        f'start = "{opens:%H:%M}"\nend = "{opens + timedelta(hours=1):%H:%M}"\n'
        'timezone = "UTC"',
    )


def _restart_daemon(vm: Vm, key: SigningKey, config: str, tag: str) -> None:
    """The admin changes config.toml and restarts ``modstage serve`` (it reads it at start)."""
    prepare(vm, {"vendor.pem": key.cert_pem.read_bytes()}, config)
    vm.python("daemon.terminate(); daemon.wait(30)")
    log = start_daemon(vm, f"daemon-{vm.boots}-{tag}.log")
    _wait_until(
        lambda: any(e.get("event") == "daemon.ready" for e in daemon_events(log)),
        90,
        "daemon.ready",
    )


def _labels(vm: Vm) -> dict[str, str]:
    """The node labels NFD makes of modstage's feature file (``modstage.io/nvidia.*``)."""
    path = f"{FEATURES}/{FILE_NAME}"
    text = str(vm.eval(f"read({path!r}) if os.path.exists({path!r}) else ''"))
    pairs = (ln.split("=", 1) for ln in text.splitlines() if ln and not ln.startswith("#"))
    prefix = "modstage.io/nvidia."  # the host's own (kernel.next) are not the bundle's
    return {k.removeprefix(prefix): v for k, v in pairs if k.startswith(prefix)}


def _labels_are(vm: Vm, expected: dict[str, str]) -> None:
    """The labels reach ``expected`` (they follow the state file within moments)."""
    _wait_until(lambda: _labels(vm) == expected, 15, f"the labels {expected}")


def _loaded(vm: Vm) -> str | None:
    """The loaded nvidia module's version, or None."""
    version = vm.eval(
        "read('/sys/module/nvidia/version') if os.path.exists('/sys/module/nvidia') else None"
    )
    return None if version is None else str(version)


def _ready(vm: Vm) -> bool:
    return bool(vm.eval("os.path.exists('/run/nvidia/validations/.driver-ctr-ready')"))


def _status(vm: Vm) -> tuple[int, dict[str, Any]]:
    """``modstage status --json``: its exit code and document."""
    rc, out = modstage(vm, "status", "--json")
    return rc, json.loads(out)


def _upgrading(vm: Vm, version: str | None, host: str = "upgrading") -> dict[str, Any]:
    """``status`` says the bundle is upgrading to ``version`` (None: the new pod's drop is
    not in yet), the unload seen by the daemon, nothing failed, and the plain view puts the
    reboot it waits for on the same line; the host says ``host`` (upgrading, exit code 4,
    unless a worse finding stands beside it: ``degraded``, exit 1). Returns the bundle's
    ``upgrading``."""
    code = {"upgrading": 4, "degraded": 1}[host]
    seen: list[tuple[int, dict[str, Any]]] = []

    def upgrading() -> bool:
        seen.append(_status(vm))
        rc, doc = seen[-1]
        up = doc["bundles"]["nvidia"]["upgrading"]
        return rc == code and up is not None and up["version"] == version and up["unload_seen"]

    _wait_until(upgrading, 30, f"status: upgrading to {version} ({host}): {seen[-1:]}")
    rc, doc = seen[-1]
    assert doc["health"] == host and not doc["bundles"]["nvidia"]["upgrading"]["expired"]
    rc, plain = modstage(vm, "status")
    assert rc == code and f"host: {host.upper()}" in plain and "FAILED" not in plain, plain
    line = next(ln for ln in plain.splitlines() if ln.startswith("  ! nvidia: upgrading"))
    assert "; reboot: " in line, line
    return dict(doc["bundles"]["nvidia"]["upgrading"])


def _healthy(vm: Vm) -> None:
    """``status`` says healthy (exit code 0)."""
    rc, doc = _status(vm)
    assert rc == 0 and doc["health"] == "healthy", doc["problems"]


class Held(NamedTuple):
    """The digest-only change as the closed window leaves it, for the path that reboots."""

    unloaded: float  # time.monotonic() when the init container unloaded v2
    asked: float  # when the host asked the reboot, the window's hold taken out
    held: float  # seconds the closed window held the reboot


class Rollout:
    """The node's driver pod as the kubelet runs it, the upgrade controller over it, and
    what each rollout path leaves for the next (the paths that passed, the table's rows)."""

    def __init__(self, vm: Vm, rootfs: Path) -> None:
        self.vm, self.rootfs = vm, rootfs
        self.revision = "1.0"  # the running pod's controller-revision-hash
        self.restarts = 0  # the driver container's restartCount in this pod
        self.running = False  # the driver container is running (not waiting to restart)
        self.controller = UpgradeController("1.0")
        self.clock = 0.0  # the controller's time: one requeue period per reconcile
        self.pods = 0
        self.results: list[dict[str, object]] = []  # the table's rows
        self.passed: list[str] = []  # the paths that passed, in order
        self.window: Held | None = None  # the closed window's hold, for the digest-only change

    # -- the kubelet ------------------------------------------------------------------------
    def init_container(self) -> str:
        """The pod's init container (runs once per pod, and again after a node reboot)."""
        result = self.vm.run(init_container(DIGEST[self.revision]), timeout=60)
        assert result.rc == 0, result.stdout + result.stderr
        return result.stdout

    def start(self) -> float:
        """Start the driver container (``nvidia-driver init``) in the background."""
        self.pods += 1
        name = f"pod-{self.pods}"
        command = "exec " + _driver(self.vm, self.rootfs, self.revision)
        self.vm.python("import subprocess")
        self.vm.eval(
            "globals().setdefault('pods', {}).__setitem__("
            f"'ctr', subprocess.Popen({command!r}, shell=True, "
            f"stdout=open('/var/lib/modstage/{name}.log', 'w'), stderr=subprocess.STDOUT))"
        )
        self.running = True
        return time.monotonic()

    def log(self) -> str:
        path = self.vm.state_dir / f"pod-{self.pods}.log"
        return path.read_text() if path.exists() else ""

    def exited(self) -> int | None:
        """The driver container's exit code once it ended (the kubelet then restarts it)."""
        return self.vm.eval("pods['ctr'].poll()") if self.running else None

    def probe(self) -> bool:
        """The startup probe, inside the running container; True when it passed."""
        pid = int(self.vm.eval("pods['ctr'].pid"))
        command, script = startup_probe(pid)
        return self.vm.run(command, input=script, timeout=30).rc == 0

    def stop(self) -> None:
        """SIGTERM to the driver container (pod deletion, or node shutdown)."""
        if self.running:  # preStop removes the readiness file, then the kubelet's SIGTERM
            self.vm.python(
                "os.remove('/run/nvidia/validations/.driver-ctr-ready') if os.path.exists("
                "'/run/nvidia/validations/.driver-ctr-ready') else None\n"
                "if pods['ctr'].poll() is None:\n"
                "    pods['ctr'].send_signal(15)\n"
                "    try:\n"
                "        pods['ctr'].wait(30)\n"
                "    except subprocess.TimeoutExpired:\n"
                "        pods['ctr'].kill(); pods['ctr'].wait()\n"
            )
        self.running = False

    def ready_after(self, started: float, timeout: float = 60) -> float:
        """Wait until the container is ready: its startup probe passed (which writes the
        readiness file) and ``init`` says it is ready (the driver root is there for the
        operands); seconds since it started."""
        _wait_until(
            lambda: "; ready" in self.log() and self.probe(), timeout, f"ready: {self.log()}"
        )
        return time.monotonic() - started

    def pod(self) -> Pod:
        """What the API server says of the driver pod."""
        ready = self.running and self.exited() is None and _ready(self.vm)
        return Pod(
            self.revision,
            True,
            (Container("nvidia-driver-ctr", ready, self.restarts),),
            (Container("k8s-driver-manager", True),),
        )

    # -- the controller ---------------------------------------------------------------------
    def reconcile(self) -> list[Action]:
        self.clock += RECONCILE_PERIOD
        return self.controller.reconcile(self.clock, self.pod(), _ready(self.vm))

    def roll_to(self, revision: str) -> float:
        """The ClusterPolicy now names ``revision``: reconcile until the controller deletes
        the driver pod, then the DaemonSet starts the new one (init container, then the
        driver container). Returns when the new pod's init container ended."""
        self.controller.new_revision(revision)
        for _ in range(10):
            if Action.DELETE_DRIVER_POD in self.reconcile():
                break
        else:
            raise AssertionError(f"the controller never deleted the pod: {self.controller}")
        assert self.controller.state is State.POD_RESTART_REQUIRED
        self.stop()
        self.revision, self.restarts = revision, 0
        return time.monotonic()

    def settle(self, most: int = 12) -> State:
        """Reconcile until the node's upgrade state stops changing."""
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

    def after(self, path: str) -> None:
        """Fail at once, naming ``path``, unless it passed: the calling path starts from the
        node that ``path`` leaves, and on any other node its assertions would mislead."""
        if path not in self.passed:
            pytest.fail(
                f"this path starts from the node that {path!r} leaves, and {path!r} did not "
                "pass on this node: it failed, or it did not run",
                pytrace=False,
            )

    def record(self, path: str, state: State, driverless: float | None, **more: object) -> None:
        """The path's row of the table, recorded as its last step: the path passed."""
        self.results.append({"path": path, "state": str(state), "driverless_s": driverless, **more})
        self.passed.append(path)


FIRST_INSTALL = "first install"  # not a row of the table: the node's start
PATHS = (
    FIRST_INSTALL,
    "pod restart, no change",
    "v1 -> v2",
    "node reboot, no change",
    "waiting for a closed window",
    "digest-only change",
    "v2 -> v3 failing at boot",
    "revert to v2 after v3 failed",
)


@pytest.fixture(scope="module")
def rollout(node: Vm, rootfs: Path) -> Iterator[Rollout]:
    """The node's driver pod and the upgrade controller over it, carried from one path to
    the next (in the order of ``PATHS``); afterwards the table of the paths that passed."""
    started = time.monotonic()
    paths = Rollout(node, rootfs)
    yield paths
    _print_and_write(paths, node)
    took = time.monotonic() - started
    print(f"operator scenario ({node.kernel.series}): {took:.0f} s, boots: {node.boots}")


def _pending(vm: Vm, version: str) -> None:
    def waiting() -> bool:
        b = state(vm).bundle("nvidia")
        gen = b.generations.get(b.pending) if b.pending else None
        return gen is not None and gen.version == version and b.phase is Phase.REBOOT_SCHEDULED

    _wait_until(waiting, 120, f"v{version} pending with a reboot asked for")


def _waiting_for_window(vm: Vm, version: str) -> float:
    """``version`` pending, and the daemon (which has seen it) asks no reboot; returns when
    it was first seen pending (``time.monotonic()``)."""

    def held() -> bool:
        b = state(vm).bundle("nvidia")
        gen = b.generations.get(b.pending) if b.pending else None
        return gen is not None and gen.version == version and b.phase is Phase.PENDING

    _wait_until(held, 120, f"v{version} pending")
    since = time.monotonic()
    time.sleep(5)  # the daemon's pass after intake decides on the reboot within moments
    assert held(), "a reboot was asked while the window is closed"
    return since


def _print_and_write(n: Rollout, vm: Vm) -> None:
    """The table of the paths that passed, as JSON on the state share; and to
    ``$MODSTAGE_ROLLOUT_RESULTS`` for bench/rollout when every path passed (the 6.1 run
    only: bench/rollout-measured.json is 6.1's; 6.12's stays on its share)."""
    kernel = vm.kernel
    accel = vm.machine.accel.upper()
    print(
        f"\nrollout paths under the operator's upgrade controller ({kernel.series} guest, {accel}):"
    )
    print(f"{'path':<34} {'upgrade state':<22} {'driver-less':>12}  note")
    for r in n.results:
        d = r["driverless_s"]
        shown = "none" if d == 0 else "open" if d is None else f"{d:.0f} s"
        print(f"{r['path']:<34} {r['state']:<22} {shown:>12}  {r.get('note', '')}")
    doc = {"kernel": kernel.release, "kured_period_s": KURED_PERIOD, "paths": n.results}
    targets = [vm.state_dir / "rollout.json"]
    complete = n.passed == list(PATHS)
    if kernel.series == "6.1" and "MODSTAGE_ROLLOUT_RESULTS" in os.environ and complete:
        targets.append(Path(os.environ["MODSTAGE_ROLLOUT_RESULTS"]))
    elif not complete:
        print(f"not every path passed (passed: {', '.join(n.passed) or 'none'}): partial table")
    for target in targets:
        target.write_text(json.dumps(doc, indent=1) + "\n")
        print(f"rollout results: {target}")


def test_first_install(rollout: Rollout, node: Vm, key: SigningKey, rootfs: Path) -> None:
    """A fresh node (boot 1): an image for another kernel is refused at once; the v1 pod's
    init container finds no driver, its container stages v1 and the host asks a reboot
    (the pod in sync on a new node: upgrade-done, nothing to upgrade); the drop is copied
    out of the pod's directory. After the reboot (boot 2) v1 is live with its digest,
    parameters and firmware, the init container keeps it and the pod is ready on it, the
    image's root (Debian 12) mounted for the operands."""
    _host_up(node, key)
    result = node.run(_driver(node, rootfs, "1.0", KERNEL_VERSION="6.99.0-other"), timeout=60)
    assert result.rc == 1 and "built for kernel 6.99.0-other (it carries: " in result.stderr
    assert f"the node runs {node.kernel.release}: use an image that carries" in result.stderr
    assert "no nvidia driver loaded: uncordoning" in rollout.init_container()
    rollout.start()
    _pending(node, "1.0")
    _labels_are(node, {"phase": "reboot_scheduled", "active": "", "pending": "1.0"})
    assert rollout.settle() is State.DONE  # a pod in sync on a new node: no upgrade to run
    assert node.eval("os.listdir('/run/nvidia/modstage/incoming')") == []  # copied out

    rollout.stop()
    node.reboot()
    _host_up(node, key)
    assert node.read("/run/nvidia/nvidia-driver.state") == DIGEST["1.0"]
    assert node.read("/sys/module/nvidia/parameters/fail") == "N"
    assert node.read("/run/modstage/firmware/nvidia/1.0/gsp_test.bin") == "gsp firmware 1.0"
    _labels_are(node, {"phase": "active", "active": "1.0", "pending": ""})
    assert "skipping the unload" in rollout.init_container()
    rollout.ready_after(rollout.start())
    assert "nvidia 1.0 is loaded (by the host)" in rollout.log()
    root = node.run("mountpoint -q /run/nvidia/driver && cat /run/nvidia/driver/etc/debian_version")
    # the image's root (Debian 12 on both kernels, also on 6.12's Debian 13 node), for the operands
    assert root.rc == 0 and root.stdout.startswith("12."), root
    rollout.passed.append(FIRST_INSTALL)


def test_pod_restart_with_no_change(rollout: Rollout, node: Vm) -> None:
    """A driver pod restart with no change unloads nothing (the modules and their users stay)
    and the new container is ready within seconds: upgrade-done.

    Starts from the node test_first_install leaves: v1 live, its pod ready."""
    rollout.after(FIRST_INSTALL)
    loaded_since = node.read("/sys/module/nvidia/refcnt")
    rollout.stop()
    assert "the nvidia modules stay loaded" in rollout.log()
    kept = rollout.init_container()
    assert "skipping the unload" in kept and "unloaded" not in kept, kept
    ready = rollout.ready_after(rollout.start())
    assert (
        set(NV) <= set(live_modules(node))
        and node.read("/sys/module/nvidia/refcnt") == loaded_since
    )
    assert rollout.settle() is State.DONE
    rollout.record("pod restart, no change", rollout.controller.state, 0.0, ready_s=round(ready, 1))


def test_v1_to_v2(rollout: Rollout, node: Vm, key: SigningKey) -> None:
    """v1 -> v2 is upgrade-done after one reboot that the host asks for: the controller
    deletes the pod, the new pod's init container unloads v1, its container stages v2 within
    a minute and waits unready (pod-restart-required); at boot 3 v2 is loaded with its
    digest, kept, the pod is ready and the node uncordoned.

    Starts from the node test_pod_restart_with_no_change leaves: v1 live, its pod ready."""
    rollout.after("pod restart, no change")
    rollout.roll_to("2.0")
    changed = rollout.init_container()
    assert "driver config changed" in changed and "unloaded nvidia" in changed, changed
    t_unload = time.monotonic()
    assert _loaded(node) is None
    assert _upgrading(node, None)["to"] is None  # the drop is not in yet: the pod is replaced
    rollout.start()
    _pending(node, "2.0")
    t_asked = time.monotonic()
    _labels_are(node, {"phase": "reboot_scheduled", "active": "1.0", "pending": "2.0"})
    _upgrading(node, "2.0")
    assert rollout.settle() is State.POD_RESTART_REQUIRED  # waiting, not ready: no timeout

    rollout.stop()
    t_down = time.monotonic()
    node.reboot()
    _host_up(node, key)
    t_loaded = time.monotonic()
    assert _loaded(node) == "2.0" and node.read("/run/nvidia/nvidia-driver.state") == DIGEST["2.0"]
    assert "skipping the unload" in rollout.init_container()
    ready = rollout.ready_after(rollout.start())
    assert rollout.settle() is State.DONE and not rollout.controller.cordoned
    _labels_are(node, {"phase": "active", "active": "2.0", "pending": ""})
    _healthy(node)
    assert t_asked - t_unload < 60, "staging takes seconds: the reboot is the driver-less time"
    rollout.record(
        "v1 -> v2",
        rollout.controller.state,
        round(t_loaded - t_unload, 1),
        staging_s=round(t_asked - t_unload, 1),
        reboot_s=round(t_loaded - t_down, 1),
        ready_s=round(ready, 1),
        note=f"+ up to kured's period ({KURED_PERIOD:.0f} s) before the reboot in the field",
    )


def test_node_reboot_with_no_change(rollout: Rollout, node: Vm, key: SigningKey) -> None:
    """A node reboot with no change (boot 4): ``modstage boot`` loads v2 again, the init
    container unloads nothing and the pod is ready within a minute: upgrade-done.

    Starts from the node test_v1_to_v2 leaves: v2 live, its pod ready."""
    rollout.after("v1 -> v2")
    rollout.stop()
    t_down = time.monotonic()
    node.reboot()
    _host_up(node, key)
    t_loaded = time.monotonic()
    assert _loaded(node) == "2.0"
    kept = rollout.init_container()
    assert "skipping the unload" in kept and "unloaded" not in kept, kept
    ready = rollout.ready_after(rollout.start())
    assert ready < 60 and rollout.settle() is State.DONE  # seconds of work; tens under loaded TCG
    _labels_are(node, {"phase": "active", "active": "2.0", "pending": ""})
    rollout.record(
        "node reboot, no change",
        rollout.controller.state,
        round(t_loaded - t_down, 1),
        ready_s=round(ready, 1),
        note="the reboot only; the pod unloads nothing",
    )


def test_closed_window_holds_a_digest_only_change(
    rollout: Rollout, node: Vm, key: SigningKey
) -> None:
    """A digest-only change (same modules and parameters) while the reboot window is closed
    (kured backend, the window opening in 5 hours): the init container unloads v2, the pod
    drops the same generation, the host makes it pending again and asks no reboot (kured's
    sentinel says "not required"); the pod waits unready, the controller stays
    pod-restart-required; over that wait the startup probe restarts the container never with
    the probe deploy/README.md sizes and over 10 times (upgrade-failed) with the default
    one. When the window opens the host asks the reboot and the pod still waits.

    Starts from the node test_node_reboot_with_no_change leaves: v2 live, its pod ready."""
    rollout.after("node reboot, no change")
    _restart_daemon(node, key, _closed_window(), "closed")
    rollout.roll_to("2.0-b")
    changed = rollout.init_container()
    assert "driver config changed" in changed and "unloaded nvidia" in changed, changed
    t_unload = time.monotonic()
    rollout.start()
    t_held = _waiting_for_window(node, "2.0")  # pending again, no reboot asked: window shut
    up = _upgrading(node, "2.0")  # never failed while the window is shut
    assert up["limit_seconds"] > 5 * 3600, up  # the bound outlasts the closed stretch
    _rc, plain = modstage(node, "status")
    assert "outside the reboot window" in plain, plain
    grade = 'modstage_bundle_grade{bundle="nvidia",health="upgrading"} 1.0'
    metrics = "/var/lib/prometheus/node-exporter/modstage.prom"
    _wait_until(lambda: grade in str(node.eval(f"read({metrics!r})")), 30, "the upgrading metric")
    rc, said = modstage(node, "status", "--reboot-required")
    assert rc == 1, said  # kured's sentinel: no reboot outside the window
    _rc, doc = modstage(node, "status", "--json")
    reboot = json.loads(doc)["reboot"]
    assert reboot["required"] and not reboot["window_open"] and reboot["next_window"], reboot
    wait = datetime.fromisoformat(reboot["next_window"]) - datetime.now(UTC)
    for _ in range(3):  # the container waits, unready, through the controller's reconciles
        assert rollout.exited() is None and not _ready(node) and rollout.reconcile() == []
    assert rollout.controller.state is State.POD_RESTART_REQUIRED
    # the kubelet's restarts over that wait (the startup probe gives up after one budget),
    # and the controller's verdict on them: the probe deploy/README.md sizes, the default
    waited = {}
    for probe, budget in (("sized", (60, 60, 5640)), ("default", (60, 10, 120))):
        restarts = restarts_while_waiting(wait.total_seconds(), *budget)
        judged = copy.deepcopy(rollout.controller)
        unready = (Container("nvidia-driver-ctr", False, restarts),)
        judged.reconcile(
            rollout.clock,
            Pod(rollout.revision, True, unready, rollout.pod().init_containers),
            False,
        )
        waited[probe] = (restarts, judged.state)
    assert waited["sized"] == (0, State.POD_RESTART_REQUIRED), waited
    assert waited["default"][0] > 10 and waited["default"][1] is State.FAILED, waited

    _restart_daemon(node, key, CONFIG, "open")  # the window opens (here: the admin's config)
    held = time.monotonic() - t_held
    _pending(node, "2.0")  # the active generation, pending again: the host asks a reboot
    t_asked = time.monotonic() - held
    b = state(node).bundle("nvidia")
    assert b.pending == b.active and rollout.exited() is None  # the pod waits, it does not fail
    _labels_are(node, {"phase": "reboot_scheduled", "active": "2.0", "pending": "2.0"})
    assert rollout.settle() is State.POD_RESTART_REQUIRED
    rollout.window = Held(t_unload, t_asked, held)
    rollout.record(
        "waiting for a closed window",
        waited["sized"][1],
        None,
        window_opens_in_s=round(wait.total_seconds()),
        restarts_default_probe=waited["default"][0],
        note=f"sized probe: no restart; default probe: {waited['default'][0]} restarts, "
        "upgrade-failed",
    )


def test_digest_only_change(rollout: Rollout, node: Vm, key: SigningKey) -> None:
    """A digest-only change is upgrade-done after the one reboot the host asked (boot 5):
    the same v2 is loaded again with the new digest, kept, the pod ready, the node
    uncordoned.

    Starts from the node test_closed_window_holds_a_digest_only_change leaves: the same v2
    pending again with the new digest's pod waiting, a reboot asked; its driver-less time
    starts there (the window's hold left out)."""
    rollout.after("waiting for a closed window")
    assert rollout.window is not None
    rollout.stop()
    t_down = time.monotonic()
    node.reboot()
    _host_up(node, key)
    t_loaded = time.monotonic()
    assert _loaded(node) == "2.0"
    assert node.read("/run/nvidia/nvidia-driver.state") == DIGEST["2.0-b"]
    assert "skipping the unload" in rollout.init_container()
    ready = rollout.ready_after(rollout.start())
    assert rollout.settle() is State.DONE and not rollout.controller.cordoned
    _labels_are(node, {"phase": "active", "active": "2.0", "pending": ""})
    _healthy(node)
    rollout.record(
        "digest-only change",
        rollout.controller.state,
        round(t_loaded - rollout.window.unloaded - rollout.window.held, 1),
        staging_s=round(rollout.window.asked - rollout.window.unloaded, 1),
        reboot_s=round(t_loaded - t_down, 1),
        ready_s=round(ready, 1),
        window_held_s=round(rollout.window.held, 1),
        note="the host asks the reboot itself (the closed window's hold not counted)",
    )


def test_v3_failing_at_boot_falls_back_to_v2(rollout: Rollout, node: Vm, key: SigningKey) -> None:
    """v2 -> v3, whose nvidia-uvm fails at init, is staged; at boot 6 v3 fails and v2 (the
    last known good) is loaded again with v3's digest published, so the v3 pod's init
    container keeps v2; labels and ``status`` name the failure (ENODEV). The v3 container
    fails, says why and asks no reboot, is never ready; the controller marks the node
    upgrade-failed (cordoned) on the 11th restart.

    Starts from the node test_digest_only_change leaves: v2 live with its new digest, its
    pod ready."""
    rollout.after("digest-only change")
    rollout.roll_to("3.0")
    unloaded = rollout.init_container()
    assert "driver config changed" in unloaded and "unloaded nvidia" in unloaded, unloaded
    t_unload = time.monotonic()
    rollout.start()
    _pending(node, "3.0")
    _labels_are(node, {"phase": "reboot_scheduled", "active": "2.0", "pending": "3.0"})
    _upgrading(node, "3.0")

    rollout.stop()
    t_down = time.monotonic()
    node.reboot()
    _host_up(node, key)
    t_fallback = time.monotonic()
    b = state(node).bundle("nvidia")
    v2 = next(g for g in b.generations.values() if g.version == "2.0")
    v3 = next(g for g in b.generations.values() if g.version == "3.0")
    assert (b.phase, b.active) == (Phase.ACTIVE, v2.id)
    assert v3.failed and "nvidia-uvm.ko: ENODEV" in v3.failed
    assert _loaded(node) == "2.0"  # the last known good
    # published: the digest of the v3 pod still deployed, so its init container keeps v2
    assert node.read("/run/nvidia/nvidia-driver.state") == DIGEST["3.0"]
    labels = _labels(node)
    assert labels["phase"] == "active" and labels["active"] == "2.0" and labels["pending"] == ""
    assert "ENODEV" in labels["failed"], labels
    rc, status = modstage(node, "status")
    assert "ENODEV" in status, status
    # the upgrade failed: no longer upgrading; v2 runs, so degraded (exit 1), as any fallback
    rc, doc = _status(node)
    assert (rc, doc["health"], doc["bundles"]["nvidia"]["upgrading"]) == (1, "degraded", None)
    kept = rollout.init_container()  # the v3 pod's init container, after the reboot
    assert "skipping the unload" in kept and "unloaded" not in kept, kept
    runs = []
    for restart in (1, 2):  # the kubelet restarts the container (not the init container)
        runs.append(rollout.start())
        _wait_until(lambda: rollout.exited() is not None, 120, f"the v3 pod ends: {rollout.log()}")
        assert rollout.exited() == 1 and "failed: modules/nvidia-uvm.ko: ENODEV" in rollout.log(), (
            rollout.log()
        )
        runs[-1] = time.monotonic() - runs[-1]
        assert _loaded(node) == "2.0" and not _ready(node)  # v2 kept; never ready on it
        rollout.running = False
        rollout.restarts = restart
        rollout.reconcile()
        b = state(node).bundle("nvidia")
        assert b.pending is None and b.phase is not Phase.REBOOT_SCHEDULED  # no reboot asked
        assert rollout.controller.state is State.POD_RESTART_REQUIRED  # unready, <= 10 restarts
    rollout.restarts = 11  # each further restart is the same run: the 11th makes the node failed
    assert rollout.settle() is State.FAILED and rollout.controller.cordoned
    rollout.record(
        "v2 -> v3 failing at boot",
        rollout.controller.state,
        round(t_fallback - t_unload, 1),
        reboot_s=round(t_fallback - t_down, 1),
        container_run_s=round(sum(runs) / len(runs), 1),
        note="never ready: the rollout halts; v2 stays loaded (the node stays cordoned)",
    )


def test_revert_to_v2_after_v3_failed(rollout: Rollout, node: Vm, key: SigningKey) -> None:
    """The admin reverts (ClusterPolicy back at v2, the failed node's pod deleted by hand:
    the controller deletes none in upgrade-failed): the v2 pod's init container unloads v2
    (the digest is v3's), the host asks a reboot, the labels keep the failure until then;
    at boot 7 v2 is loaded with its own digest, kept, the pod ready: upgrade-done, with no
    reboot loop.

    Starts from the node test_v3_failing_at_boot_falls_back_to_v2 leaves: v2 loaded after
    v3 failed, the v3 pod unready, the node upgrade-failed."""
    rollout.after("v2 -> v3 failing at boot")
    failed = _labels(node)["failed"]
    assert "ENODEV" in failed, failed
    rollout.controller.new_revision("2.0-b")  # upgrade-failed: the controller deletes no pod
    assert rollout.settle() is State.FAILED
    rollout.stop()
    rollout.revision, rollout.restarts = "2.0-b", 0
    unloaded = rollout.init_container()  # the published digest is v3's: v2 is unloaded
    assert "driver config changed" in unloaded and "unloaded nvidia" in unloaded, unloaded
    t_unload = time.monotonic()
    rollout.start()
    _pending(node, "2.0")  # the active generation, pending again: the host asks a reboot
    # upgrading, and still degraded by v3's failure until v2 is up again
    assert _upgrading(node, "2.0", "degraded")["to"] == state(node).bundle("nvidia").active
    reverting = {"phase": "reboot_scheduled", "active": "2.0", "pending": "2.0"}
    _labels_are(node, {**reverting, "failed": failed})  # until v2 is up again
    rollout.stop()
    t_down = time.monotonic()
    node.reboot()
    _host_up(node, key)
    t_loaded = time.monotonic()
    assert _loaded(node) == "2.0"
    assert node.read("/run/nvidia/nvidia-driver.state") == DIGEST["2.0-b"]  # no loop
    kept = rollout.init_container()
    assert "skipping the unload" in kept and "unloaded" not in kept, kept
    ready = rollout.ready_after(rollout.start())
    assert rollout.settle() is State.DONE and not rollout.controller.cordoned
    _labels_are(node, {"phase": "active", "active": "2.0", "pending": ""})
    _healthy(node)
    rollout.record(
        "revert to v2 after v3 failed",
        rollout.controller.state,
        round(t_loaded - t_unload, 1),
        reboot_s=round(t_loaded - t_down, 1),
        ready_s=round(ready, 1),
        note="the admin deletes the failed node's pod; one reboot, asked by the host",
    )


def test_an_unload_with_nothing_pending_is_a_failure(rollout: Rollout, node: Vm) -> None:
    """Someone unloads nvidia_uvm by hand while v2 runs and its pod is ready, nothing
    pending: ``status`` says failed (exit code 2), never upgrading, naming the module.

    Starts from the node test_revert_to_v2_after_v3_failed leaves (v2 live, its pod
    ready); the last step of the scenario (the node keeps no driver afterwards)."""
    rollout.after("revert to v2 after v3 failed")
    assert _ready(node) and state(node).bundle("nvidia").pending is None
    result = node.run("rmmod nvidia_uvm", timeout=60)
    assert result.rc == 0, result.stdout + result.stderr
    rc, doc = _status(node)
    nvidia = doc["bundles"]["nvidia"]
    assert (rc, doc["health"], nvidia["upgrading"]) == (2, "failed", None), doc["problems"]
    assert any("nvidia_uvm are not loaded" in r for r in nvidia["reasons"]), nvidia["reasons"]

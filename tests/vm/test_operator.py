"""Driver upgrades under the NVIDIA GPU operator's pod, unchanged.

The pod is simulated in the guest with the mounts of the operator's driver DaemonSet
(tests/vm/operator/pod.sh), its init container by a stand-in applying k8s-driver-manager's
uninstall_driver decision (uninstall_driver.sh), its startup
probe by startup_probe.sh; the driver container runs deploy/driver-container's
``nvidia-driver`` (stager.driver). The host runs ``modstage serve`` with the pod's
directory in ``incoming_dirs`` and ``modstage boot`` at every boot. Four boots:

1. fresh node: an image for another kernel is refused at once; v1 is staged by ``init``,
   taken in by the daemon from /run/nvidia; reboot.
2. v1 loaded by ``modstage boot``, its digest in /run/nvidia/nvidia-driver.state: the init
   container keeps it, ``init`` finishes (driver root, readiness), the startup probe
   passes, SIGTERM leaves the modules loaded. Then the image changes to v3 whose
   nvidia-uvm fails init: the init container unloads v1 (config changed), v3 is staged;
   reboot.
3. v3 fails, v1 is loaded again (last known good); the v3 pod reports the failure and
   exits 1 twice, asking for no reboot. Then v2 is staged; reboot.
4. v2 live, kept by the init container, ``init`` ready; v1 kept as last known good.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from service.store.phase import Phase
from tests.kmod import SigningKey, kernel_release, make_key
from tests.vm.harness import Vm, VmFactory
from tests.vm.node import daemon_events, live_modules, modstage, prepare, start_daemon, state
from tests.vm.node import wait_until as _wait_until
from tests.vm.operator import (
    container_env,
    init_container,
    make_image,
    nvidia_driver,
    startup_probe,
)
from tests.vm.operator.image import driver_rootfs

pytestmark = pytest.mark.vm
KERNEL = kernel_release()
CONFIG = """\
incoming_dirs = ["/var/lib/modstage/incoming", "/run/nvidia/modstage/incoming"]
[publish]
status_dirs = ["/run/nvidia/modstage/status"]
digest_files = { nvidia = "/run/nvidia/nvidia-driver.state" }
[reboot]
backend = "none"
min_delay = 0
"""
NV = ("nvidia", "nvidia_modeset", "nvidia_uvm")
DIGEST = {"1.0": "3520785164", "2.0": "1177712841", "3.0": "2846122119"}  # per ClusterPolicy


@pytest.fixture(scope="module")
def key(tmp_path_factory: pytest.TempPathFactory) -> SigningKey:
    """NVIDIA's module signing key in this test (the host trusts its certificate)."""
    return make_key(tmp_path_factory.mktemp("nvkey"), "rsa4096", cn="driver vendor")


@pytest.fixture(scope="module")
def rootfs() -> Path:
    """The driver image built from deploy/driver-container (its root file system)."""
    return driver_rootfs()


@pytest.fixture(scope="module")
def node(boot_vm: VmFactory, key: SigningKey, rootfs: Path) -> Iterator[Vm]:
    """A GPU node with each version's payload on its state share (the pod binds them)."""
    vm = boot_vm("operator")
    params = {"1.0": {"nvidia": "fail=0"}, "2.0": {}, "3.0": {"nvidia-uvm": "fail=1"}}
    for version, conf in params.items():
        make_image(vm.state_dir / "images" / version, version, key, conf)
    yield vm
    vm.close()


def _image(version: str) -> str:
    return f"/var/lib/modstage/images/{version}"


def _driver(rootfs: Path, version: str, verb: str = "init", **env: str) -> str:
    return nvidia_driver(
        rootfs, _image(version), container_env(version, DIGEST[version], **env), verb
    )


def _host_up(vm: Vm, key: SigningKey) -> Path:
    """What the node does at every boot: config, ``modstage boot``, then the daemon."""
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


def _init_container(vm: Vm, version: str) -> str:
    result = vm.run(init_container(DIGEST[version]), timeout=60)
    assert result.rc == 0, result.stdout + result.stderr
    return result.stdout


def _start_pod(vm: Vm, rootfs: Path, version: str, name: str) -> int:
    """Start ``nvidia-driver init`` in the pod, in the background; return its pid."""
    command = "exec " + _driver(rootfs, version)
    vm.python("import subprocess")
    return int(
        vm.eval(
            "globals().setdefault('pods', {}).__setitem__("
            f"{name!r}, subprocess.Popen({command!r}, shell=True, "
            f"stdout=open('/var/lib/modstage/{name}.log', 'w'), stderr=subprocess.STDOUT)) "
            f"or pods[{name!r}].pid"
        )
    )


def _pod_log(vm: Vm, name: str) -> str:
    path = vm.state_dir / f"{name}.log"
    return path.read_text() if path.exists() else ""


def _pending(vm: Vm, version: str) -> None:
    def waiting() -> bool:
        b = state(vm).bundle("nvidia")
        gen = b.generations.get(b.pending) if b.pending else None
        return gen is not None and gen.version == version and b.phase is Phase.REBOOT_SCHEDULED

    _wait_until(waiting, 120, f"v{version} pending with a reboot asked for")


def _loaded(vm: Vm) -> str | None:
    return vm.eval(
        "read('/sys/module/nvidia/version') if os.path.exists('/sys/module/nvidia') else None"
    )


def _ready(vm: Vm) -> bool:
    return bool(vm.eval("os.path.exists('/run/nvidia/validations/.driver-ctr-ready')"))


def _finish_ready(vm: Vm, rootfs: Path, version: str, name: str) -> int:
    """The pod's init finds its version loaded and finishes; the probe passes. Returns pid."""
    kept = _init_container(vm, version)
    assert "skipping the unload" in kept, kept
    assert _loaded(vm) == version
    pid = _start_pod(vm, rootfs, version, name)
    _wait_until(lambda: _ready(vm), 60, f"readiness of {name}: {_pod_log(vm, name)}")
    assert f"nvidia {version} is loaded (by the host)" in _pod_log(vm, name)
    command, script = startup_probe(pid)
    probe = vm.run(command, input=script, timeout=30)
    assert probe.rc == 0 and f"Driver Version: {version}" in probe.stdout, probe
    root = vm.run("mountpoint -q /run/nvidia/driver && cat /run/nvidia/driver/etc/debian_version")
    assert root.rc == 0 and root.stdout.startswith("12."), root  # the image, for the operands
    return pid


def test_driver_upgrades_under_the_operator_pod(node: Vm, key: SigningKey, rootfs: Path) -> None:
    """v1 and v2 go live through the operator's unchanged pod; the init container keeps each;
    a failing v3 falls back to v1 and is reported, not retried; another kernel is refused."""
    started = time.monotonic()
    # -- boot 1: nothing loaded yet ---------------------------------------------------------
    _host_up(node, key)
    result = node.run(_driver(rootfs, "1.0", KERNEL_VERSION="6.99.0-other"), timeout=60)
    assert result.rc == 1 and "built for kernel 6.99.0-other, the node runs" in result.stderr
    assert "no nvidia driver loaded: uncordoning" in _init_container(node, "1.0")
    _start_pod(node, rootfs, "1.0", "pod-v1-a")
    _pending(node, "1.0")
    _wait_until(lambda: "reboot_scheduled" in _pod_log(node, "pod-v1-a"), 30, "the pod sees it")
    assert node.eval("os.listdir('/run/nvidia/modstage/incoming')") == []  # copied out

    print(f"operator: {time.monotonic() - started:.0f} s before boot 2")
    # -- boot 2: v1 live; then the image changes to v3 --------------------------------------
    node.reboot()
    _host_up(node, key)
    assert node.read("/run/nvidia/nvidia-driver.state") == DIGEST["1.0"]
    assert node.read("/sys/module/nvidia_uvm/version") == "1.0"
    assert node.read("/sys/module/nvidia/parameters/fail") == "N"
    assert node.read("/run/modstage/firmware/nvidia/1.0/gsp_test.bin") == "gsp firmware 1.0"
    pid = _finish_ready(node, rootfs, "1.0", "pod-v1-b")
    assert node.eval("pods['pod-v1-b'].send_signal(15) or pods['pod-v1-b'].wait(30)") == 0
    assert "the nvidia modules stay loaded" in _pod_log(node, "pod-v1-b")
    assert set(NV) <= set(live_modules(node)) and pid

    changed = _init_container(node, "3.0")  # the ClusterPolicy now names v3
    assert "driver config changed" in changed and "unloaded nvidia" in changed, changed
    assert _loaded(node) is None
    _start_pod(node, rootfs, "3.0", "pod-v3-a")
    _pending(node, "3.0")

    print(f"operator: {time.monotonic() - started:.0f} s before boot 3")
    # -- boot 3: v3 fails, v1 is back; the v3 pod reports instead of looping ----------------
    node.reboot()
    _host_up(node, key)
    b = state(node).bundle("nvidia")
    v1 = next(g for g in b.generations.values() if g.version == "1.0")
    v3 = next(g for g in b.generations.values() if g.version == "3.0")
    assert (b.phase, b.active) == (Phase.ACTIVE, v1.id)
    assert v3.failed and "nvidia-uvm.ko: ENODEV" in v3.failed
    assert _loaded(node) == "1.0"
    assert node.read("/run/nvidia/nvidia-driver.state") == DIGEST["1.0"]
    for attempt in ("b", "c"):  # the pod restarts: each time one clear failure, no reboot
        _init_container(node, "3.0")
        run = node.run(_driver(rootfs, "3.0"), timeout=120)
        assert run.rc == 1, f"pod-v3-{attempt}: {run.stdout}{run.stderr}"
        assert "failed: modules/nvidia-uvm.ko: ENODEV" in run.stdout, run.stdout
        b = state(node).bundle("nvidia")
        assert b.pending is None and b.phase is not Phase.REBOOT_SCHEDULED

    # v2: the init container finds nothing loaded (v3's pod unloaded v1), v2 is staged
    assert "no nvidia driver loaded" in _init_container(node, "2.0")
    _start_pod(node, rootfs, "2.0", "pod-v2-a")
    _pending(node, "2.0")

    print(f"operator: {time.monotonic() - started:.0f} s before boot 4")
    # -- boot 4: v2 live, v1 last known good -------------------------------------------------
    node.reboot()
    _host_up(node, key)
    assert node.read("/run/nvidia/nvidia-driver.state") == DIGEST["2.0"]
    _finish_ready(node, rootfs, "2.0", "pod-v2-b")
    b = state(node).bundle("nvidia")
    v2 = next(g for g in b.generations.values() if g.version == "2.0")
    assert (b.phase, b.active, b.pending) == (Phase.ACTIVE, v2.id, None)
    assert v1.id in b.generations and not b.generations[v1.id].failed
    assert (node.state_dir / "store" / v1.id).is_dir(), "v1 is kept as last known good"
    print(f"operator scenario: 4 boots, {time.monotonic() - started:.0f} s")

"""modstage's main job, as a cluster operator runs it, on a real kernel: ``tests/demo``.

A GPU node boots Debian's signed 6.1 kernel under QEMU. The NVIDIA GPU operator's driver pod
is played as the operator renders it (tests/vm/operator: the pod's mounts, the init
container's decision, the startup probe), with the driver image built from
deploy/driver-container. The host runs ``modstage boot`` at every boot and ``modstage serve``
with the pod's directory under /run/nvidia. kured's part is its sentinel command
(``modstage status --reboot-required``) and the reboot. The cluster operator installs driver
1.0, then changes the ClusterPolicy to 2.0. ``modstage status`` is printed after every step.
"""

from __future__ import annotations

import sys
import tempfile
import time
from pathlib import Path

from tests.kmod import kernel_release, make_key
from tests.vm.harness import Vm
from tests.vm.node import daemon_events, modstage, prepare, start_daemon, wait_until
from tests.vm.operator import container_env, init_container, make_image, nvidia_driver
from tests.vm.operator.image import driver_rootfs

CONFIG = """\
incoming_dirs = ["/var/lib/modstage/incoming", "/run/nvidia/modstage/incoming"]
[publish]
status_dirs = ["/run/nvidia/modstage/status"]
digest_files = { nvidia = "/run/nvidia/nvidia-driver.state" }
[reboot]
backend = "kured"   # the daemon records its request; kured asks `status --reboot-required`
min_delay = 0
"""
DIGEST = {"1.0": "3520785164", "2.0": "1177712841"}  # DRIVER_CONFIG_DIGEST per ClusterPolicy


def say(text: str) -> None:
    """Narrate one step."""
    print(f"\n\033[1m==> {text}\033[0m", flush=True)


def show(vm: Vm, *argv: str) -> int:
    """Print a ``modstage`` command's output as an admin on the node sees it."""
    rc, out = modstage(vm, *argv)
    print(f"$ modstage {' '.join(argv)}\n{out.rstrip()}\n(exit code {rc})", flush=True)
    return rc


class Node:
    """The GPU node of the demo, with the operator's pod for each driver version."""

    def __init__(self, vm: Vm, rootfs: Path, cert: bytes) -> None:
        self.vm, self.rootfs, self.cert = vm, rootfs, cert

    def host_up(self) -> None:
        """What the node runs at every boot: ``modstage boot``, then the daemon."""
        prepare(self.vm, {"vendor.pem": self.cert}, CONFIG)
        rc, out = modstage(self.vm, "boot")
        print(f"$ modstage boot\n{out.rstrip()}\n(exit code {rc})")
        log = start_daemon(self.vm, f"daemon-{self.vm.boots}.log")
        wait_until(
            lambda: any(e.get("event") == "daemon.ready" for e in daemon_events(log)),
            90,
            "the daemon's start",
        )

    def init_container(self, version: str) -> None:
        """The pod's init container (k8s-driver-manager's decision) with the pod's digest."""
        result = self.vm.run(init_container(DIGEST[version]), timeout=60)
        print("  init container: " + " / ".join(result.stdout.strip().splitlines()[-2:]))

    def driver(self, version: str) -> str:
        """The pod's main container: ``nvidia-driver init`` from the driver image."""
        env = container_env(version, DIGEST[version])
        return nvidia_driver(self.rootfs, f"/var/lib/modstage/images/{version}", env)

    def stage(self, version: str) -> None:
        """Start the pod's ``init`` in the background and wait until the host has the drop."""
        log = f"/var/lib/modstage/pod-{version}.log"
        self.vm.run(f"nohup {self.driver(version)} > {log} 2>&1 &", timeout=30)
        wait_until(
            lambda: "reboot_scheduled" in self.pod_log(version), 180, f"driver {version} staged"
        )
        print("  driver container: " + self.pod_log(version).strip().splitlines()[-1])

    def pod_log(self, version: str) -> str:
        """What the pod's ``init`` printed so far."""
        path = self.vm.state_dir / f"pod-{version}.log"
        return path.read_text() if path.exists() else ""

    def finish(self, version: str) -> bool:
        """After the reboot: the pod's ``init`` finds its driver loaded and becomes ready."""
        self.vm.run(f"nohup {self.driver(version)} > /var/lib/modstage/pod-{version}.log 2>&1 &")
        ready = "os.path.exists('/run/nvidia/validations/.driver-ctr-ready')"
        wait_until(lambda: self.vm.eval(ready), 90, f"driver {version} ready")
        print("  driver container: " + self.pod_log(version).strip().splitlines()[-1])
        state = self.vm.read("/run/nvidia/nvidia-driver.state")
        loaded = self.vm.read("/sys/module/nvidia/version")
        print(f"  /run/nvidia/nvidia-driver.state = {state}; /sys/module/nvidia/version = {loaded}")
        return loaded == version and state == DIGEST[version]

    def reboot_by_kured(self) -> None:
        """kured's sentinel command says 0; kured drains and reboots the node."""
        rc = show(self.vm, "status", "--reboot-required")
        print(f"  kured: sentinel command exit {rc}: " + ("reboot" if rc == 0 else "no reboot"))
        self.vm.reboot()


def build(work: Path) -> tuple[Path, bytes, Path]:
    """The vendor's side: signed driver payloads for 1.0 and 2.0, and the driver image."""
    key = make_key(work / "key", "rsa4096", cn="Example GPU vendor")
    images = work / "state" / "images"
    for version in DIGEST:
        make_image(images / version, version, key, {"nvidia": "fail=0"})
    return driver_rootfs(), key.cert_pem.read_bytes(), work / "state"


def upgrade(node: Node, version: str, before: str | None) -> bool:
    """The cluster operator sets ``version`` in the ClusterPolicy; the node ends up on it."""
    say(f"ClusterPolicy says driver {version}: the operator (re)starts the driver pod")
    node.init_container(version)
    node.stage(version)
    # an upgrade: the init container unloaded `before`; until the reboot that is planned
    # work (exit code 4, upgrading), not a failure
    upgrading = show(node.vm, "status") == 4
    if before is not None and not upgrading:
        print(f"  expected status to say upgrading (exit code 4) from {before} to {version}")
        return False
    say("kured asks modstage whether the node needs a reboot, and reboots it")
    node.reboot_by_kured()
    say("Next boot: modstage boot loads the new generation before the kubelet starts")
    node.host_up()
    show(node.vm, "status")
    say(f"The pod starts again: its init container finds {version} loaded as desired")
    node.init_container(version)
    ok = node.finish(version)
    if before is not None:
        show(node.vm, "generations", "nvidia")
    return ok


def main() -> int:
    """Run the demo; exit 0 when every step did what it says."""
    started = time.monotonic()
    work = Path(tempfile.mkdtemp(prefix="modstage-demo-"))
    say("Vendor side: fake NVIDIA 1.0 and 2.0 built against Debian's headers, signed")
    rootfs, cert, state_dir = build(work)
    say(f"Boot the GPU node: Debian {kernel_release()}; the host trusts the vendor certificate")
    with Vm.boot(state_dir, name="demo") as vm:
        node = Node(vm, rootfs, cert)
        node.host_up()
        show(vm, "status")
        ok = upgrade(node, "1.0", None) and upgrade(node, "2.0", "1.0")
    say(f"Demo {'complete' if ok else 'FAILED'} in {time.monotonic() - started:.0f} s")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())

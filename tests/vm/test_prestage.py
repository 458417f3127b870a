"""A precompiled pool's kernel update on a real node: the pre-stage pod, one reboot, the driver kept.

A Debian 12 node on 6.1 runs the fake NVIDIA driver 1.0 as its pool's pod for 6.1 left it
(active, that pod's digest published). Debian 13's 6.12 is installed (as in
``test_kernel_update.py``) and unattended-upgrades asks for the reboot:

1. ``status --reboot-required`` holds it (exit 4): ``nvidia`` has nothing for 6.12;
2. the pre-stage pod (``deploy/kubernetes/nvidia-prestage.yaml``): 6.12's precompiled image,
   the driver image with 6.12's modules, runs ``nvidia-driver prestage`` in the driver pod's
   stand-in with the digest the operator gives 6.12's pod, until SIGTERM (exit 0). It stages
   one drop, for 6.12, carrying that digest; the 6.1 modules stay loaded, the driver root is
   not bound, no readiness file, the published digest is still 6.1's pod's;
3. intake judges the drop against 6.12's files: pending for 6.12, the sentinel says reboot;
4. one reboot, into 6.12: ``modstage boot`` loads it and publishes 6.12's pod's digest, so
   the init container stand-in (``k8s-driver-manager uninstall_driver``) with that digest
   keeps the driver loaded.

A plain pool's kernel update (the same image for every kernel): the node's sleeping driver pod
stages the next kernel from its own image, one reboot, the driver kept
(:func:`test_a_plain_pools_sleeping_pod_stages_the_next_kernel_from_its_multi_kernel_image`).

Both run under the 6.1 parametrisation (they boot 6.12 as the second kernel).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from service.bundles.phase import Phase
from tests.kmod import SigningKey, make_key
from tests.vm.harness import Vm, exports_cache, kmod
from tests.vm.harness.kernel import Kernel
from tests.vm.node import OPERATOR_CONFIG as CONFIG
from tests.vm.node import drop, live_modules, modstage, prepare, state
from tests.vm.operator import (
    NAMES,
    build_nvidia,
    container_env,
    init_container,
    make_image,
    nvidia_driver,
)
from tests.vm.operator.image import driver_rootfs, placed
from tests.vm.test_kernel_update import _host, _install, _publish

pytestmark = [pytest.mark.vm, pytest.mark.kernels("6.1")]
RUNNING_DIGEST = "3520785164"  # the operator's digest for the pool's 6.1 pod
NEXT_DIGEST = "1626662984"  # for its 6.12 pod (a precompiled digest covers the kernel)


@pytest.fixture(scope="module")
def key(tmp_path_factory: pytest.TempPathFactory) -> SigningKey:
    """The driver vendor's key, trusted by the node."""
    return make_key(tmp_path_factory.mktemp("prestage-vendor"), "rsa4096", cn="driver vendor")


def test_the_prestage_pod_makes_a_precompiled_pools_kernel_update_one_reboot(
    kernel: Kernel, key: SigningKey, tmp_path: Path
) -> None:
    """The steps of the module docstring, each checked on the node."""
    new = Kernel.named("6.12")
    certs = {"vendor.pem": key.cert_pem.read_bytes()}
    config = CONFIG + f'[kernel]\nnext = "{new.release}"\n'
    share = tmp_path / "state"
    exports_cache.seed(share, new)
    signed = tmp_path / "old"
    signed.mkdir()
    old = [
        (kmod.sign(kernel, ko, key, signed / f"{name}.ko"), "")
        for name, ko in build_nvidia("1.0", kernel).items()
    ]
    with (
        Vm(share, name="prestage-6.1", kernel=kernel) as node,
        placed(driver_rootfs(kernel), kernel) as rootfs,
    ):
        node.start()
        prepare(node, certs, CONFIG)
        drop(node, "nvidia", "1.0", kernel.release, old, config_digest=RUNNING_DIGEST)
        assert modstage(node, "intake")[0] == 0
        rc, out = modstage(node, "boot", replay_boot=False)
        assert rc == 0, out
        assert state(node).bundle("nvidia").phase is Phase.ACTIVE
        assert node.read("/run/nvidia/nvidia-driver.state") == RUNNING_DIGEST

        _install(node, new)
        node.run("mkdir -p /run/nvidia/modstage/incoming /var/run").check()
        node.run("echo '*** System restart required ***' > /var/run/reboot-required").check()
        prepare(node, certs, config)
        _publish(node)
        code, out = modstage(node, "status", "--reboot-required")
        assert code == 4 and "nvidia has no generation" in out, out

        make_image(share / "images" / "next", "1.0", key, {}, new)
        env = container_env("1.0", NEXT_DIGEST, new, MODSTAGE_NEXT_KERNEL_EVERY="1")
        pod = nvidia_driver(Path(rootfs), "/var/lib/modstage/images/next", env, "prestage")
        done = node.run(f"timeout --preserve-status -s TERM 25 {pod}", timeout=90)
        assert done.rc == 0, done
        assert done.stdout.count(f"the next boot runs kernel {new.release}: staged") == 1, done
        drops = node.run("ls /run/nvidia/modstage/incoming").check().stdout.split()
        assert len(drops) == 1, drops
        digest = node.read(f"/run/nvidia/modstage/incoming/{drops[0]}/config-digest")
        assert digest == NEXT_DIGEST
        assert {"nvidia", "nvidia_modeset", "nvidia_uvm"} <= set(live_modules(node))
        assert node.run("mountpoint -q /run/nvidia/driver").rc != 0
        assert node.run("test -e /run/nvidia/validations/.driver-ctr-ready").rc != 0
        assert node.read("/run/nvidia/nvidia-driver.state") == RUNNING_DIGEST

        rc, out = modstage(node, "intake", timeout=600)  # 6.12's files read over 9p
        assert rc == 0, out
        b = state(node).bundle("nvidia")
        assert b.pending is not None and b.generations[b.pending].kernel == new.release
        pending = b.pending
        code, out = modstage(node, "status", "--reboot-required")
        assert code == 0, out
        _publish(node)
        assert _host(share)["bundles"]["nvidia"]["next"] == "ready"  # type: ignore[index]
        node.poweroff()

    with Vm(share, name="prestage-6.12", kernel=new) as node:
        node.start()  # the one reboot, into the kernel the update installed
        prepare(node, certs, CONFIG)
        rc, out = modstage(node, "boot", replay_boot=False)
        assert rc == 0, out
        b = state(node).bundle("nvidia")
        assert (b.phase, b.active) == (Phase.ACTIVE, pending)
        assert node.read("/run/nvidia/nvidia-driver.state") == NEXT_DIGEST
        kept = node.run(init_container(NEXT_DIGEST), timeout=60)
        assert kept.rc == 0 and "skipping the unload" in kept.stdout, kept
        assert {n.replace("-", "_") for n in NAMES} <= set(live_modules(node))


PLAIN_DIGEST = "2838416977"  # a plain pool's digest: the same for every kernel's pod


def test_a_plain_pools_sleeping_pod_stages_the_next_kernel_from_its_multi_kernel_image(
    kernel: Kernel, key: SigningKey, tmp_path: Path
) -> None:
    """A 6.1 node runs the fake NVIDIA driver 1.0 as its plain pool's pod left it; the pool's
    image carries 1.0 for 6.1 and 6.12 (``/opt/modstage/modules/<release>/``, as
    ``build-image --kernel`` twice makes it; no ``KERNEL_VERSION``: the pod takes the
    node's). 6.12 is installed and the reboot held (exit 4). The pod (``nvidia-driver
    init``) finds its driver loaded, is ready, and while it sleeps stages 1.0 for 6.12 once,
    from its own image; intake judges it against 6.12's files, pending for 6.12, and the gate
    lifts. One reboot into 6.12: ``modstage boot`` loads it, the digest file keeps the pool's
    digest, so the init container keeps the driver, and the same image's pod on 6.12 finds
    its driver loaded and is ready."""
    new = Kernel.named("6.12")
    certs = {"vendor.pem": key.cert_pem.read_bytes()}
    config = CONFIG + f'[kernel]\nnext = "{new.release}"\n'
    share = tmp_path / "state"
    exports_cache.seed(share, new)
    image = share / "images" / "multi"
    make_image(image, "1.0", key, {}, kernel)
    extra = image / "opt/modstage/modules" / new.release
    extra.mkdir()
    for name, ko in build_nvidia("1.0", new).items():
        kmod.sign(new, ko, key, extra / f"{name}.ko")
    env = container_env("1.0", PLAIN_DIGEST, kernel, MODSTAGE_NEXT_KERNEL_EVERY="1")
    del env["KERNEL_VERSION"]  # a multi-kernel image names none: the node's own
    old = [(image / "opt/modstage/modules" / kernel.release / f"{n}.ko", "") for n in NAMES]
    with (
        Vm(share, name="plain-6.1", kernel=kernel) as node,
        placed(driver_rootfs(kernel), kernel) as rootfs,
    ):
        node.start()
        prepare(node, certs, CONFIG)
        drop(node, "nvidia", "1.0", kernel.release, old, config_digest=PLAIN_DIGEST)
        assert modstage(node, "intake")[0] == 0
        rc, out = modstage(node, "boot", replay_boot=False)
        assert rc == 0, out
        assert state(node).bundle("nvidia").phase is Phase.ACTIVE

        _install(node, new)
        node.run("mkdir -p /run/nvidia/modstage/incoming /var/run").check()
        node.run("echo '*** System restart required ***' > /var/run/reboot-required").check()
        prepare(node, certs, config)
        _publish(node)
        code, out = modstage(node, "status", "--reboot-required")
        assert code == 4 and "nvidia has no generation" in out, out

        pod = nvidia_driver(Path(rootfs), "/var/lib/modstage/images/multi", env, "init")
        done = node.run(f"timeout --preserve-status -s TERM 25 {pod}", timeout=90)
        assert done.rc == 0, done
        assert "nvidia 1.0 is loaded (by the host)" in done.stdout, done
        assert done.stdout.count(f"the next boot runs kernel {new.release}: staged") == 1, done
        drops = node.run("ls /run/nvidia/modstage/incoming").check().stdout.split()
        assert len(drops) == 1, drops
        assert node.read(f"/run/nvidia/modstage/incoming/{drops[0]}/config-digest") == PLAIN_DIGEST

        rc, out = modstage(node, "intake", timeout=600)  # 6.12's files read over 9p
        assert rc == 0, out
        b = state(node).bundle("nvidia")
        assert b.pending is not None and b.generations[b.pending].kernel == new.release
        pending = b.pending
        code, out = modstage(node, "status", "--reboot-required")
        assert code == 0, out
        _publish(node)
        assert _host(share)["bundles"]["nvidia"]["next"] == "ready"  # type: ignore[index]
        node.poweroff()

    with (
        Vm(share, name="plain-6.12", kernel=new) as node,
        placed(driver_rootfs(new), new) as rootfs,
    ):
        node.start()  # the one reboot, into the kernel the update installed
        prepare(node, certs, CONFIG)
        rc, out = modstage(node, "boot", replay_boot=False)
        assert rc == 0, out
        b = state(node).bundle("nvidia")
        assert (b.phase, b.active) == (Phase.ACTIVE, pending)
        assert node.read("/run/nvidia/nvidia-driver.state") == PLAIN_DIGEST
        kept = node.run(init_container(PLAIN_DIGEST), timeout=60)
        assert kept.rc == 0 and "skipping the unload" in kept.stdout, kept
        assert {n.replace("-", "_") for n in NAMES} <= set(live_modules(node))
        pod = nvidia_driver(Path(rootfs), "/var/lib/modstage/images/multi", env, "init")
        done = node.run(f"timeout --preserve-status -s TERM 15 {pod}", timeout=90)
        assert done.rc == 0 and "nvidia 1.0 is loaded (by the host)" in done.stdout, done
        assert node.run("test -e /run/nvidia/validations/.driver-ctr-ready").rc == 0

"""The image build-image writes, on a node: one image of Debian's real 550 driver for 6.1
and 6.12, staged by its own ``nvidia-driver init`` on either kernel.

The image is built once for the session (tests/nvidia builds the driver, cached), loaded
into podman on the host and its root file system exported: the pod runs it in the guest as
the operator's pod runs a driver image (tests/vm/operator/pod.sh: the image's root under an
overlay, the host's /run/nvidia), with the environment the image's config declares and what
the operator adds. The host takes the drop in and boots it: without a GPU the driver's init
finds none, so the bundle is ``no_device``, and the pod, waiting for the host's verdict,
ends with exit 5 saying so.
"""

from __future__ import annotations

import io
import json
import os
import shlex
import subprocess
import tarfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from buildimage.cli import main
from buildimage.oci import read_archive

from tests.kmod import SigningKey, cache_root, make_key
from tests.vm.harness import VmFactory
from tests.vm.harness.kernel import Kernel
from tests.vm.node import OPERATOR_CONFIG as CONFIG
from tests.vm.node import modstage, prepare, state, wait_until
from tests.vm.operator import HERE
from tests.vm.operator.image import placed

pytestmark = [pytest.mark.vm, pytest.mark.nvidia, pytest.mark.kernels("6.1", "6.12")]
DRIVER = "550.163.01-2"


@pytest.fixture(scope="session")
def pool_key(tmp_path_factory: pytest.TempPathFactory) -> SigningKey:
    """The pool's signing key (the node trusts its certificate)."""
    return make_key(tmp_path_factory.mktemp("pool-key"), "rsa4096", cn="pool key")


def _podman(storage: Path, *argv: str) -> None:
    conf = storage / "storage.conf"
    if not conf.exists():
        storage.mkdir(parents=True)
        conf.write_text(
            f'[storage]\ndriver = "vfs"\ngraphroot = "{storage}/g"\nrunroot = "{storage}/r"\n'
        )
    env = {**os.environ, "CONTAINERS_STORAGE_CONF": str(conf)}
    done = subprocess.run(["podman", *argv], env=env, capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stderr


@pytest.fixture(scope="session")
def image(
    pool_key: SigningKey, tmp_path_factory: pytest.TempPathFactory
) -> tuple[Path, dict[str, str]]:
    """(the image's root file system exported from podman, its environment): 550 for both
    kernels, built by build-image with the pool's key."""
    work = tmp_path_factory.mktemp("driver-image")
    kernels = [Kernel.named("6.1"), Kernel.named("6.12")]
    argv = ["--driver", DRIVER, "--key", str(pool_key.key), "--cert", str(pool_key.cert_pem)]
    argv += [a for k in kernels for a in ("--kernel", f"{k.release}={k.root}")]
    argv += ["--output", str(work / "image.oci.tar"), "--cache", str(cache_root())]
    assert main(argv, io.StringIO()) == 0
    _manifest, config, _ = read_archive(work / "image.oci.tar")
    ref = "localhost/modstage/nvidia-driver:550.163.01"
    _podman(work / "podman", "load", "-i", str(work / "image.oci.tar"))
    _podman(work / "podman", "create", "--name", "exported", ref, "true")
    _podman(work / "podman", "export", "-o", str(work / "rootfs.tar"), "exported")
    with tarfile.open(work / "rootfs.tar") as tar:
        tar.extractall(work / "rootfs", filter="tar")
    (work / "rootfs.tar").unlink()
    env = dict(e.split("=", 1) for e in config["config"]["Env"])
    return work / "rootfs", env


@pytest.fixture
def rootfs(image: tuple[Path, dict[str, str]], kernel: Kernel) -> Iterator[str]:
    """The image's root where the node sees it."""
    with placed(image[0], kernel) as guest_path:
        yield guest_path


def test_one_image_stages_the_running_kernels_modules_on_either_kernel(
    boot_vm: VmFactory,
    kernel: Kernel,
    pool_key: SigningKey,
    image: tuple[Path, dict[str, str]],
    rootfs: str,
) -> None:
    """On this kernel's node the image's ``nvidia-driver init`` stages 550.163.01 from the
    image's directory for the running kernel (its manifest names it), with the firmware; the
    host takes it in (the modules as built and signed by build-image) and boots it: the real
    init finds no GPU, the bundle is no_device, and the waiting pod ends with exit 5."""
    node = boot_vm("driver-image")
    prepare(node, {"pool.pem": pool_key.cert_pem.read_bytes()}, CONFIG)
    assert modstage(node, "boot")[0] == 0
    node.run("mkdir -p /run/nvidia/modstage/incoming").check()
    env = {
        **image[1],
        "DRIVER_CONFIG_DIGEST": "1234",
        "NODE_NAME": "node",
        "MODSTAGE_HOST_WAIT": "60",
    }
    assignments = " ".join(shlex.quote(f"{k}={v}") for k, v in env.items())
    pod = f"sh {HERE / 'pod.sh'} {shlex.quote(rootfs)} {shlex.quote(rootfs)} env -i {assignments} nvidia-driver init"
    node.run(
        f"nohup sh -c {shlex.quote(pod + '; echo exit=$?')} > /tmp/pod.log 2>&1 < /dev/null &"
    ).check()
    said = lambda: node.read("/tmp/pod.log")  # noqa: E731
    wait_until(lambda: "waiting for the host" in said() or "exit=" in said(), 300, "the drop")
    assert "; waiting for the host" in said(), said()
    assert modstage(node, "intake", timeout=900)[0] == 0
    gen = str(state(node).bundle("nvidia").pending)
    stored = node.state_dir / "store" / gen
    release = kernel.release
    for name in ("nvidia", "nvidia-modeset", "nvidia-uvm"):
        built = image[0] / "opt/modstage/modules" / release / f"{name}.ko"
        assert (stored / "modules" / f"{name}.ko").read_bytes() == built.read_bytes()
    assert list((stored / "firmware").rglob("gsp_*.bin"))
    assert modstage(node, "boot", timeout=900)[0] == 0
    bundle = state(node).bundle("nvidia")
    assert bundle.phase.value == "no_device", bundle.history[-1].note
    wait_until(lambda: "exit=" in node.read("/tmp/pod.log"), 120, "the pod to end")
    log = said()
    assert "staging nvidia 550.163.01 for the host to load at boot" in log, log
    assert log.rstrip().endswith("exit=5"), log
    assert json.loads(node.read("/run/nvidia/modstage/status/nvidia.json"))["phase"] == "no_device"

"""The GPU operator's side of the operator test (tests/vm/test_operator.py).

Fake NVIDIA modules (``nvfake.c`` built as nvidia, nvidia-modeset and nvidia-uvm with a
driver version), a driver image laid out as deploy/driver-container's Containerfile lays
it out, and the shell commands that play the operator's pod in the guest: ``pod.sh``
(the driver container's mounts), ``uninstall_driver.sh`` (the init container's
decision), ``startup_probe.sh`` (the startup probe). The modules are built against the
node's kernel (``kernel``, default the host's Debian 12 6.1): on Debian 13's 6.12 with its
own headers and gcc-14 inside its root (tests/vm/harness/kmod.py), and signed with its own
``sign-file``; the image's ``KERNEL_VERSION`` and module directory name that kernel too.
"""

from __future__ import annotations

import hashlib
import shlex
import shutil
from pathlib import Path

from tests.kmod import SigningKey, cache_root
from tests.vm.harness import kmod
from tests.vm.harness.kernel import Kernel

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[2]
NAMES = ("nvidia", "nvidia-modeset", "nvidia-uvm")  # load order; the image's MODSTAGE_MODULES


def node_kernel(kernel: Kernel | None) -> Kernel:
    """``kernel``, or the host's own Debian 12 kernel (what tests/vm/demo.py boots)."""
    return kernel or Kernel.find()


def build_nvidia(version: str, kernel: Kernel | None = None) -> dict[str, Path]:
    """Unsigned fake NVIDIA modules reporting ``version``, built against ``kernel``'s
    headers once per machine (cached)."""
    release = node_kernel(kernel).release
    source = (HERE / "nvfake.c").read_bytes()
    key = hashlib.sha256(source + f"\0{release}\0{version}".encode()).hexdigest()[:16]

    def fill(work: Path) -> None:
        for name in NAMES:
            (work / f"{name}.c").write_bytes(source)
        (work / "Kbuild").write_text(
            "obj-m := " + " ".join(f"{n}.o" for n in NAMES) + "\n"
            f"ccflags-y := -DNV_VERSION='\"{version}\"'\n"
        )

    final = kmod.build_tree(
        node_kernel(kernel), cache_root() / f"nvfake-{release}-{version}-{key}", fill
    )
    return {n: final / f"{n}.ko" for n in NAMES}


def make_image(
    into: Path,
    version: str,
    key: SigningKey,
    params: dict[str, str],
    kernel: Kernel | None = None,
) -> Path:
    """A driver image's files under ``into`` for ``kernel``: signed modules, firmware,
    nvidia-smi, /drivers.

    ``params`` is the kernelModuleConfig ConfigMap: ``{"nvidia-uvm": "fail=1"}``.
    """
    kernel = node_kernel(kernel)
    mods = into / "opt/modstage/modules" / kernel.release
    mods.mkdir(parents=True)
    for name, ko in build_nvidia(version, kernel).items():
        kmod.sign(kernel, ko, key, mods / f"{name}.ko")
    fw = into / "opt/modstage/firmware/nvidia" / version
    fw.mkdir(parents=True)
    (fw / "gsp_test.bin").write_bytes(f"gsp firmware {version}\n".encode())
    (into / "opt/modstage/bin").mkdir()
    shutil.copy(HERE / "nvidia-smi", into / "opt/modstage/bin/nvidia-smi")
    (into / "opt/modstage/bin/nvidia-smi").chmod(0o755)
    (into / "drivers").mkdir()
    for name, text in params.items():
        (into / "drivers" / f"{name}.conf").write_text(text + "\n")
    return into


def container_env(
    version: str, digest: str, kernel: Kernel | None = None, **extra: str
) -> dict[str, str]:
    """The driver container's environment: the image's ENV (built for ``kernel``) and what
    the operator adds."""
    return {
        "PATH": "/opt/modstage/bin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
        "PYTHONDONTWRITEBYTECODE": "1",
        "DRIVER_VERSION": version,
        "KERNEL_VERSION": node_kernel(kernel).release,
        "DRIVER_CONFIG_DIGEST": digest,
        "NODE_NAME": "node",
        "MODSTAGE_HOST_WAIT": "60",
        **extra,
    }


def pod(rootfs: Path, payload: str, env: dict[str, str], *argv: str) -> str:
    """The shell command running ``argv`` in the driver container of the operator's pod."""
    assignments = " ".join(shlex.quote(f"{k}={v}") for k, v in env.items())
    command = " ".join(shlex.quote(a) for a in argv)
    where = f"{shlex.quote(str(rootfs))} {shlex.quote(payload)}"
    return f"sh {HERE / 'pod.sh'} {where} env -i {assignments} {command}"


def nvidia_driver(rootfs: Path, payload: str, env: dict[str, str], verb: str = "init") -> str:
    """``nvidia-driver VERB`` in the pod, as the operator's ``command``/``args`` run it."""
    return pod(rootfs, payload, env, "nvidia-driver", verb)


def init_container(digest: str) -> str:
    """The init container (``k8s-driver-manager uninstall_driver``) with the pod's digest."""
    return f"DRIVER_CONFIG_DIGEST={shlex.quote(digest)} sh {HERE / 'uninstall_driver.sh'}"


def startup_probe(pid: int) -> tuple[str, str]:
    """The startup probe inside the running driver container: (command, script on stdin)."""
    command = f"nsenter -t {pid} -m -r -w env PATH=/opt/modstage/bin:/usr/bin:/bin sh -s"
    return command, (HERE / "startup_probe.sh").read_text()

"""The GPU operator's side of the operator test (tests/vm/test_operator.py).

Fake NVIDIA modules (``nvfake.c`` built as nvidia, nvidia-modeset and nvidia-uvm with a
driver version), a driver image laid out as deploy/driver-container's Containerfile lays
it out, and the shell commands that play the operator's pod in the guest: ``pod.sh``
(the driver container's mounts), ``uninstall_driver.sh`` (the init container's
decision), ``startup_probe.sh`` (the startup probe).
"""

from __future__ import annotations

import hashlib
import shlex
import shutil
from pathlib import Path

from tests.kmod import SigningKey, cache_root, kernel_release, sign
from tests.kmod.build import build_once

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[2]
NAMES = ("nvidia", "nvidia-modeset", "nvidia-uvm")  # load order; the image's MODSTAGE_MODULES


def build_nvidia(version: str) -> dict[str, Path]:
    """Unsigned fake NVIDIA modules reporting ``version``; built once per machine (cached)."""
    release = kernel_release()
    source = (HERE / "nvfake.c").read_bytes()
    key = hashlib.sha256(source + f"\0{release}\0{version}".encode()).hexdigest()[:16]

    def fill(work: Path) -> None:
        for name in NAMES:
            (work / f"{name}.c").write_bytes(source)
        (work / "Kbuild").write_text(
            "obj-m := " + " ".join(f"{n}.o" for n in NAMES) + "\n"
            "ccflags-y := -DNV_VERSION='\"$(NV_VERSION)\"'\n"
        )

    final = build_once(
        cache_root() / f"nvfake-{release}-{version}-{key}", fill, f"NV_VERSION={version}"
    )
    return {n: final / f"{n}.ko" for n in NAMES}


def make_image(into: Path, version: str, key: SigningKey, params: dict[str, str]) -> Path:
    """A driver image's files under ``into``: signed modules, firmware, nvidia-smi, /drivers.

    ``params`` is the kernelModuleConfig ConfigMap: ``{"nvidia-uvm": "fail=1"}``.
    """
    release = kernel_release()
    mods = into / "opt/modstage/modules" / release
    mods.mkdir(parents=True)
    for name, ko in build_nvidia(version).items():
        sign(ko, key, mods / f"{name}.ko")
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


def container_env(version: str, digest: str, **extra: str) -> dict[str, str]:
    """The driver container's environment: the image's ENV and what the operator adds."""
    return {
        "PATH": "/opt/modstage/bin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
        "PYTHONDONTWRITEBYTECODE": "1",
        "DRIVER_VERSION": version,
        "KERNEL_VERSION": kernel_release(),
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

"""The driver image's file system and settings, laid out as the operator runs it.

Layers, bottom up (a registry shares each unchanged one between images):

1. the base: a Debian root file system tar with ``python3``, ``python3-tomli-w``, ``mount``
   and ``util-linux`` (``mmdebstrap``, made once into the cache unless ``--base`` names one);
2. modstage's container side: ``stager/`` in ``/opt/modstage/lib`` and the ``nvidia-driver``
   command in ``/usr/local/bin``;
3. the driver's user space: the GSP firmware in ``/opt/modstage/firmware/nvidia/<version>/``
   (not ``/lib/firmware``: the operator mounts the host's over it) and ``nvidia-smi`` with
   its NVML library in ``/opt/modstage/nvidia/``, run by ``/opt/modstage/bin/nvidia-smi``;
4. one layer per kernel: its signed modules in ``/opt/modstage/modules/<release>/``;
5. the build report, ``/opt/modstage/build.json``.

The environment is the one ``deploy/driver-container/Containerfile`` sets, without
``KERNEL_VERSION``: ``nvidia-driver`` takes the node's running kernel and finds its modules
under ``MODSTAGE_MODULES_ROOT`` (stager/driver.py), whichever of the image's kernels it is.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from buildimage import BuildError
from buildimage.modules import KernelModules
from buildimage.oci import Layer, image_config, layer_from_tar, layer_from_tree, write_archive

HERE = Path(__file__).resolve().parent.parent  # deploy/driver-container
REPO = HERE.parent.parent
BASE_PACKAGES = "python3,python3-tomli-w,mount,util-linux"
BASE_SUITE = "bookworm"
#: What the pod stages: not nvidia-drm (the operator's init never unloads it and it keeps
#: nvidia-modeset busy); nvidia-peermem is loaded by the host for GPUDirect RDMA if added.
STAGED_MODULES = "nvidia nvidia-modeset nvidia-uvm"
SMI_WRAPPER = (
    "#!/bin/sh\n"
    'exec env LD_LIBRARY_PATH=/opt/modstage/nvidia /opt/modstage/nvidia/nvidia-smi "$@"\n'
)


@dataclass(frozen=True)
class Contents:
    """Everything the image carries, gathered (and every module accepted) before writing."""

    version: str  # the driver's version, e.g. 550.163.01
    kernels: list[KernelModules]
    firmware: Path | None  # a directory of the version's firmware files (gsp_*.bin)
    smi: Path | None  # a directory with nvidia-smi and libnvidia-ml.so.1
    base: Path  # the base root file system tar
    staged: str = STAGED_MODULES


def base_tar(cache: Path) -> Path:
    """``mmdebstrap --variant=minbase`` of Debian 12 with the packages ``nvidia-driver``
    needs, as one tar, made once into ``cache``."""
    final = cache / f"base-{BASE_SUITE}-{BASE_PACKAGES.replace(',', '+')}.tar"
    if final.is_file():
        return final
    cache.mkdir(parents=True, exist_ok=True)
    argv = ["mmdebstrap", "--variant=minbase", "--format=tar", f"--include={BASE_PACKAGES}"]
    done = subprocess.run(
        [*argv, BASE_SUITE, f"{final}.tmp"], capture_output=True, text=True, check=False
    )
    if done.returncode != 0:
        raise BuildError(
            f"mmdebstrap of the base failed ({done.returncode}): {done.stderr[-2000:]}"
        )
    Path(f"{final}.tmp").rename(final)
    return final


def _tree(scratch: Path, name: str) -> Path:
    tree = scratch / "layers" / name
    tree.mkdir(parents=True)
    return tree


def _stager_tree(scratch: Path) -> Path:
    tree = _tree(scratch, "stager")
    lib = tree / "opt/modstage/lib/stager"
    lib.mkdir(parents=True)
    for path in sorted((REPO / "stager").rglob("*")):
        if path.suffix == ".py" or path.name == "py.typed":
            target = lib / path.relative_to(REPO / "stager")
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(path, target)
    (tree / "usr/local/bin").mkdir(parents=True)
    shutil.copy2(HERE / "nvidia-driver", tree / "usr/local/bin/nvidia-driver")
    return tree


def _userspace_tree(scratch: Path, contents: Contents) -> Path:
    tree = _tree(scratch, "userspace")
    if contents.firmware is not None:
        shutil.copytree(
            contents.firmware, tree / f"opt/modstage/firmware/nvidia/{contents.version}"
        )
    else:
        (tree / "opt/modstage/firmware").mkdir(parents=True)
    if contents.smi is not None:
        shutil.copytree(contents.smi, tree / "opt/modstage/nvidia", symlinks=True)
        (tree / "opt/modstage/bin").mkdir(parents=True)
        (tree / "opt/modstage/bin/nvidia-smi").write_text(SMI_WRAPPER)
        (tree / "opt/modstage/bin/nvidia-smi").chmod(0o755)
    return tree


def _kernel_tree(scratch: Path, modules: KernelModules) -> Path:
    tree = _tree(scratch, f"kernel-{modules.kernel.release}")
    into = tree / "opt/modstage/modules" / modules.kernel.release
    into.mkdir(parents=True)
    for name in modules.names:
        shutil.copyfile(modules.directory / f"{name}.ko", into / f"{name}.ko")
        (into / f"{name}.ko").chmod(0o644)
    return tree


def environment(contents: Contents) -> dict[str, str]:
    """The image's environment (``nvidia-driver``'s settings)."""
    return {
        "DRIVER_VERSION": contents.version,
        "MODSTAGE_MODULES": contents.staged,
        "MODSTAGE_MODULES_ROOT": "/opt/modstage/modules",
        "MODSTAGE_FIRMWARE_DIR": "/opt/modstage/firmware" if contents.firmware else "",
        "MODSTAGE_DIR": "/run/nvidia/modstage",
        "PATH": "/opt/modstage/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
        "PYTHONDONTWRITEBYTECODE": "1",
    }


def labels(contents: Contents, report: dict[str, Any]) -> dict[str, str]:
    """What a registry or ``podman inspect`` shows of the build without pulling it."""
    return {
        "org.opencontainers.image.version": contents.version,
        "io.modstage.driver": report["driver"]["source"],
        "io.modstage.kernels": " ".join(m.kernel.release for m in contents.kernels),
        "io.modstage.signer": report["signer"]["subject"],
        "io.modstage.report": "/opt/modstage/build.json",
    }


def write(
    contents: Contents, report: dict[str, Any], output: Path, ref: str, cache: Path, scratch: Path
) -> str:
    """Write the image to the OCI archive ``output`` named ``ref``; its manifest digest."""
    blobs = scratch / "blobs"  # this image's layers: they go with the scratch directory
    report_tree = _tree(scratch, "report")
    (report_tree / "opt/modstage").mkdir(parents=True)
    (report_tree / "opt/modstage/build.json").write_text(json.dumps(report, indent=1) + "\n")
    # the base is compressed once per content (its layer is the same in every image)
    base = layer_from_tar(contents.base, cache / "oci-base", f"base: {contents.base.name}")
    layers: list[Layer] = [base]
    layers.append(layer_from_tree(_stager_tree(scratch), blobs, "modstage: stager, nvidia-driver"))
    layers.append(
        layer_from_tree(
            _userspace_tree(scratch, contents),
            blobs,
            f"nvidia {contents.version}: firmware, nvidia-smi",
        )
    )
    for modules in contents.kernels:
        layers.append(
            layer_from_tree(
                _kernel_tree(scratch, modules), blobs, f"modules for {modules.kernel.release}"
            )
        )
    layers.append(layer_from_tree(report_tree, blobs, "build report"))
    created = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    config = image_config(
        layers, environment(contents), ["nvidia-driver", "init"], labels(contents, report), created
    )
    return write_archive(output, layers, config, ref)

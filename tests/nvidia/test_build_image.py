"""build-image on Debian's real 550 driver: one image for Debian 12's 6.1 and 13's 6.12.

The pool runs both kernels (one is what the distribution ships next): the builder builds
``nvidia-kernel-source`` 550.163.01-2 against each (6.12 in its Debian 13 root with its
gcc-14), strips, signs with each kernel's ``sign-file``, has ``modstage verify`` accept the
five modules against each kernel's own files, and writes one OCI archive with the GSP
firmware and ``nvidia-smi`` of the same version. podman loads it; the image's root, exported,
runs ``nvidia-smi`` (NVIDIA's binary and its NVML library on the image's Debian base) and
its ``nvidia-driver`` finds both kernels' modules.
"""

from __future__ import annotations

import io
import json
import os
import subprocess
import tarfile
import time
from pathlib import Path
from typing import Any

from buildimage.cli import main
from buildimage.nvidia import MODULE_NAMES
from buildimage.oci import read_archive

from stager.driver import Settings
from tests.kmod import cache_root, make_key
from tests.vm.harness.kernel import Kernel

VERSION = "550.163.01-2"


def _build(
    output: Path, key: Path, cert: Path, kernels: list[Kernel]
) -> tuple[dict[str, Any], float]:
    argv = ["--driver", VERSION, "--key", str(key), "--cert", str(cert)]
    for kernel in kernels:
        argv += ["--kernel", f"{kernel.release}={kernel.root}"]
    argv += ["--output", str(output), "--cache", str(cache_root()), "--json"]
    out = io.StringIO()
    started = time.monotonic()
    assert main(argv, out) == 0
    return json.loads(out.getvalue()), time.monotonic() - started


def _podman(storage: Path, *argv: str) -> str:
    conf = storage / "storage.conf"
    if not conf.exists():
        storage.mkdir(parents=True, exist_ok=True)
        conf.write_text(
            f'[storage]\ndriver = "vfs"\ngraphroot = "{storage}/graph"\nrunroot = "{storage}/run"\n'
        )
    env = {**os.environ, "CONTAINERS_STORAGE_CONF": str(conf)}
    done = subprocess.run(["podman", *argv], env=env, capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stderr
    return done.stdout


def test_one_image_carries_550_for_6_1_and_6_12_and_podman_runs_it(tmp_path: Path) -> None:
    """Both kernels' five modules, signed and accepted, in one archive with the firmware and
    nvidia-smi of 550.163.01; a second run reuses both builds and writes byte-identical
    module layers (sign-file's signatures carry no time); podman loads the archive under its
    name with the labels; in its exported root nvidia-smi runs to NVIDIA's "couldn't
    communicate with the NVIDIA driver" (exit 9: no driver on this machine) and
    nvidia-driver's settings carry both kernels."""
    kernels = [Kernel.named("6.1"), Kernel.named("6.12")]
    releases = [k.release for k in kernels]
    key = make_key(tmp_path / "key", "rsa4096", cn="pool key")
    first, _seconds = _build(tmp_path / "a.oci.tar", key.key, key.cert_pem, kernels)
    again, seconds = _build(tmp_path / "b.oci.tar", key.key, key.cert_pem, kernels)
    assert list(first["kernels"]) == releases
    for release, record in again["kernels"].items():
        assert record["cached"] is True
        assert [m.removesuffix(".ko") for m in record["modules"]] == list(MODULE_NAMES)
        assert all(m["vermagic"].startswith(release + " ") for m in record["modules"].values())
        assert record["modules"] == first["kernels"][release]["modules"]
    print(
        f"second run: {seconds:.1f} s; archive {again['image']['archive_bytes']} bytes "
        f"of inputs {again['image']['inputs_bytes']}"
    )
    manifest_a, _config, _ = read_archive(tmp_path / "a.oci.tar")
    manifest, config, entries = read_archive(tmp_path / "b.oci.tar")
    layers = [layer["digest"] for layer in manifest["layers"]]
    assert layers[:-1] == [layer["digest"] for layer in manifest_a["layers"]][:-1]
    for release in releases:
        for name in MODULE_NAMES:
            assert f"opt/modstage/modules/{release}/{name}.ko" in entries
    assert any(e.startswith("opt/modstage/firmware/nvidia/550.163.01/gsp_") for e in entries)
    assert config["config"]["Labels"]["io.modstage.kernels"] == " ".join(releases)

    storage = tmp_path / "podman"
    loaded = _podman(storage, "load", "-i", str(tmp_path / "b.oci.tar"))
    assert "localhost/modstage/nvidia-driver:550.163.01" in loaded
    labels = json.loads(
        _podman(
            storage,
            "inspect",
            "--format",
            "{{json .Config.Labels}}",
            "localhost/modstage/nvidia-driver:550.163.01",
        )
    )
    assert labels["io.modstage.driver"] == f"nvidia-kernel-source {VERSION}"
    _podman(
        storage,
        "create",
        "--name",
        "exported",
        "localhost/modstage/nvidia-driver:550.163.01",
        "true",
    )
    _podman(storage, "export", "-o", str(tmp_path / "rootfs.tar"), "exported")
    rootfs = tmp_path / "rootfs"
    with tarfile.open(tmp_path / "rootfs.tar") as tar:
        tar.extractall(rootfs, filter="tar")
    smi = subprocess.run(
        ["chroot", str(rootfs), "/opt/modstage/bin/nvidia-smi"],
        capture_output=True,
        text=True,
        check=False,
    )
    assert smi.returncode == 9 and "couldn't communicate with the NVIDIA driver" in smi.stdout
    env = dict(e.split("=", 1) for e in config["config"]["Env"])
    assert Settings.from_environ(
        {**env, "KERNEL_VERSION": releases[0]}, rootfs
    ).carried() == sorted(releases)

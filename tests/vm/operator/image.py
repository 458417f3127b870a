"""The driver image really built, and its root file system for the pod (tests/vm/operator).

``mmdebstrap --variant=minbase bookworm`` makes the base from Debian's packages alone,
``podman import`` turns it into an image, and deploy/driver-container/Containerfile is
built on top with podman (vfs storage, no container is run: the build only copies). The
image's root file system is exported for the test VM, where pod.sh runs it (chrooted, in
the pod's mount namespace). Running the image with podman inside the TCG guest was tried:
loading its six layers with the vfs driver took 550 s and then filled the guest's tmpfs,
far beyond the suite's budget. Everything is cached under the test cache, keyed by the
files that go into the image and the node's kernel (the image's ``KERNEL_VERSION`` and the
modules baked into it are that kernel's). The image stays Debian 12 based on either kernel:
it is the pod's user space, chrooted in the guest's pod namespace, not the node's root. A
6.12 node boots a root of its own, which cannot see the host's cache: :func:`placed` links
the image into that root's ``/tmp`` for the test's life.
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from tests.kmod import cache_root
from tests.vm.harness.kernel import Kernel
from tests.vm.operator import HERE, REPO, build_nvidia, node_kernel

BASE_PACKAGES = "python3,python3-tomli-w,mount,util-linux"
TAG = "localhost/modstage-test/nvidia-driver:1.0"


def _run(argv: list[str], env: dict[str, str], **kw: object) -> None:
    done = subprocess.run(argv, env=env, capture_output=True, text=True, check=False, **kw)  # type: ignore[call-overload]
    if done.returncode != 0:
        raise RuntimeError(
            f"{' '.join(argv[:3])} failed ({done.returncode}):\n{done.stderr[-3000:]}"
        )


def _inputs() -> bytes:
    files = [
        REPO / "deploy/driver-container/Containerfile",
        REPO / "deploy/driver-container/nvidia-driver",
    ]
    files += [*sorted((REPO / "stager").rglob("*.py")), HERE / "nvidia-smi", HERE / "nvfake.c"]
    return b"".join(p.name.encode() + b"\0" + p.read_bytes() for p in files)


def driver_rootfs(kernel: Kernel | None = None) -> Path:
    """The root file system (a directory on the host) of the image built for ``kernel``
    (default: the host's own), built once per input (cached)."""
    kernel = node_kernel(kernel)
    inputs = _inputs() + BASE_PACKAGES.encode() + kernel.release.encode()
    key = hashlib.sha256(inputs).hexdigest()[:16]
    root = cache_root() / "driver-image"
    final = root / f"rootfs-{key}"
    if (final / "usr/local/bin/nvidia-driver").exists():
        return final
    root.mkdir(exist_ok=True)
    with open(root / "build.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if (final / "usr/local/bin/nvidia-driver").exists():
            return final
        env = _podman_env(root)
        base = root / "base-bookworm.tar"
        if not base.exists():
            _run(
                [
                    "mmdebstrap",
                    "--variant=minbase",
                    "--format=tar",
                    f"--include={BASE_PACKAGES}",
                    "bookworm",
                    str(base) + ".tmp",
                ],
                env,
            )
            os.replace(str(base) + ".tmp", base)
        _run(["podman", "import", str(base), "localhost/modstage-driver-base:bookworm"], env)
        work = Path(tempfile.mkdtemp(prefix="image-", dir=root))
        try:
            _build(work, env, kernel)
            _export(work / "rootfs", env)
            (work / "rootfs").rename(final)
        finally:
            shutil.rmtree(work, ignore_errors=True)
    return final


def _podman_env(root: Path) -> dict[str, str]:
    conf = root / "storage.conf"
    conf.write_text(
        f'[storage]\ndriver = "vfs"\ngraphroot = "{root}/storage"\nrunroot = "{root}/run"\n'
    )
    return {**os.environ, "CONTAINERS_STORAGE_CONF": str(conf)}


@contextmanager
def placed(rootfs: Path, kernel: Kernel) -> Iterator[str]:
    """``rootfs`` where ``kernel``'s node sees it (a guest path): as it is on the host's
    root (6.1); hard-linked into the node's own root's ``/tmp`` (6.12) until the end."""
    if not kernel.own_root:
        yield str(rootfs)
        return
    holder = Path(tempfile.mkdtemp(prefix="modstage-driver-image-", dir=kernel.root / "tmp"))
    try:
        done = subprocess.run(
            ["cp", "-a", "--link", str(rootfs), str(holder / "rootfs")],
            capture_output=True,
            text=True,
            check=False,
        )
        if done.returncode != 0:  # another file system: a copy (about 230 MB)
            shutil.rmtree(holder / "rootfs", ignore_errors=True)
            _run(["cp", "-a", str(rootfs), str(holder / "rootfs")], dict(os.environ))
        yield f"/tmp/{holder.name}/rootfs"
    finally:
        shutil.rmtree(holder, ignore_errors=True)


def _build(work: Path, env: dict[str, str], kernel: Kernel) -> None:
    contexts = {name: work / name for name in ("modules", "firmware", "userspace")}
    for d in contexts.values():
        d.mkdir()
    for name, ko in build_nvidia("1.0", kernel).items():
        shutil.copy(ko, contexts["modules"] / f"{name}.ko")
    (contexts["firmware"] / "gsp_test.bin").write_text("gsp firmware 1.0\n")
    (contexts["userspace"] / "bin").mkdir()
    shutil.copy(HERE / "nvidia-smi", contexts["userspace"] / "bin/nvidia-smi")
    # the build context: the repository's files the Containerfile copies, nothing else
    ctx = work / "context"
    shutil.copytree(REPO / "stager", ctx / "stager", ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copytree(REPO / "deploy/driver-container", ctx / "deploy/driver-container")
    argv = ["podman", "build", "-f", str(ctx / "deploy/driver-container/Containerfile")]
    argv += [f"--build-context={n}={p}" for n, p in contexts.items()]
    argv += ["--build-arg=DRIVER_VERSION=1.0", f"--build-arg=KERNEL_VERSION={kernel.release}"]
    _run([*argv, "--squash-all", "-t", TAG, str(ctx)], env)


def _export(into: Path, env: dict[str, str]) -> None:
    into.mkdir()
    name = f"export-{os.getpid()}"
    _run(["podman", "create", "--name", name, TAG, "true"], env)
    try:
        tar = into.parent / "rootfs.tar"
        _run(["podman", "export", "-o", str(tar), name], env)
        _run(["tar", "-x", "-f", str(tar), "-C", str(into)], env)
        tar.unlink()
    finally:
        subprocess.run(["podman", "rm", "-f", name], env=env, capture_output=True, check=False)

"""NVIDIA's kernel modules built from Debian's source packages, as DKMS builds them.

``nvidia-kernel-source`` (the proprietary driver: an open interface layer linked with
NVIDIA's binary object) or ``nvidia-open-kernel-source`` (the open GPU kernel modules) is
fetched (:mod:`buildimage.archive`), its source tarball unpacked, and kbuild run through
NVIDIA's Makefile with ``SYSSRC=`` the ``-common`` headers and ``SYSOUT=`` the ``-amd64``
ones, which is how DKMS builds them on a Debian host; then, as DKMS does before it signs and
installs a module (Debian's ``nvidia-kernel-dkms`` sets no ``STRIP[]=no``), each module is
stripped of its debug sections with ``strip -g`` (550's ``nvidia-uvm.ko`` goes from about
55 MB to 4 MB, its ``nvidia.ko`` from 99 MB to 88 MB). The unsigned modules, the build's
``Module.symvers`` and ``build.json`` (how long it took, on how many CPUs, at what load)
are kept in ``<cache>/nvidia-<flavor>-<version>-<release>-r<recipe>``; a second run costs
a directory lookup. A build that failed keeps its error beside it (``.failed``).

For a kernel whose headers and compiler live in a Debian root of their own, the source is
unpacked inside that root and ``make`` runs there under ``chroot``; NVIDIA's Makefile takes
the compiler the kernel was built with from its ``CONFIG_CC_VERSION_TEXT``, as under DKMS.
Builds at once serialise on a lock of their own.

The GSP firmware (``firmware-nvidia-gsp``) and ``nvidia-smi`` with the NVML library it
needs (``nvidia-smi``, ``libnvidia-ml1``) of the same Debian version are unpacked once into
``<cache>/nvidia-gsp-<version>`` and ``<cache>/nvidia-smi-<version>``.
"""

from __future__ import annotations

import fcntl
import json
import os
import shutil
import subprocess
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from buildimage import BuildError
from buildimage.archive import deb, extract
from buildimage.kernel import KernelFiles

# Load order: nvidia first; modeset, uvm and peermem import from it; drm from modeset.
MODULE_NAMES = ("nvidia", "nvidia-modeset", "nvidia-uvm", "nvidia-drm", "nvidia-peermem")
PACKAGES = {"proprietary": "nvidia-kernel-source", "open": "nvidia-open-kernel-source"}
FIRMWARE_PACKAGE = "firmware-nvidia-gsp"
SMI_PACKAGES = ("nvidia-smi", "libnvidia-ml1")
RECIPE = 2  # bump when the build below changes: the cache key includes it (2: strip -g)


@dataclass(frozen=True)
class Driver:
    """One built, unsigned NVIDIA driver for one kernel and how long its build took."""

    flavor: str  # proprietary | open
    version: str  # the driver's version, e.g. 550.163.01
    kernel: str  # the release it was built against
    modules: dict[str, Path]  # name -> unsigned .ko, in load order
    symvers: Path  # the build's Module.symvers (the driver's own exports)
    build: dict[str, object]  # build.json: seconds, cpus, load averages, commands
    cached: bool = False  # found in the cache (not built by this call)

    @property
    def package_version(self) -> str:
        """The Debian package version the driver was built from (``550.163.01-2``)."""
        return str(self.build["package_version"])


def _make(kernel: KernelFiles, source: Path, log: Path) -> list[str]:
    sysrc, sysout = kernel.headers
    argv = ["make", f"-j{os.cpu_count() or 1}", f"SYSSRC={sysrc}", f"SYSOUT={sysout}", "modules"]
    command, env = kernel.command(source, argv)
    with log.open("w") as out:
        proc = subprocess.run(
            command, cwd=source, env=env, stdout=out, stderr=subprocess.STDOUT, check=False
        )
    if proc.returncode != 0:
        tail = log.read_text(errors="replace")[-4000:]
        raise BuildError(
            f"NVIDIA build against {kernel.release} failed ({proc.returncode}):\n{tail}"
        )
    return argv


def strip_argv(names: list[str]) -> list[str]:
    """DKMS's strip of a built module (dkms's ``STRIP[#]`` defaults to yes)."""
    return ["strip", "-g", *names]


def _build(cache: Path, final: Path, package: Path, kernel: KernelFiles, version: str) -> None:
    with kernel.scratch(cache) as work:
        out = Path(tempfile.mkdtemp(prefix="nvidia-out-", dir=cache))  # renamed to final
        try:
            unpacked = extract(package, work / "deb")
            [tarball] = (unpacked / "usr/src").glob("nvidia*.tar.xz")
            (work / "src").mkdir()
            subprocess.run(["tar", "-xJf", str(tarball), "-C", str(work / "src")], check=True)
            source = min(
                (
                    p.parent
                    for p in (work / "src").rglob("Kbuild")
                    if (p.parent / "Makefile").is_file()
                ),
                key=lambda p: len(p.parts),
            )
            load_before = os.getloadavg()
            started = time.monotonic()
            argv = _make(kernel, source, work / "make.log")
            seconds = time.monotonic() - started
            stripped = strip_argv([f"{name}.ko" for name in MODULE_NAMES])
            kernel.run(source, stripped, "strip -g")
            for name in MODULE_NAMES:
                shutil.copyfile(source / f"{name}.ko", out / f"{name}.ko")
            shutil.copyfile(source / "Module.symvers", out / "Module.symvers")
            record = {
                "package": package.name,
                "package_version": version,
                "kernel": kernel.release,
                "seconds": round(seconds, 1),
                "cpus": os.cpu_count(),
                "load_before": [round(x, 2) for x in load_before],
                "load_after": [round(x, 2) for x in os.getloadavg()],
                "command": " ".join(argv),
                "stripped": " ".join(stripped),
                "root": str(kernel.root),  # "/", or the Debian root the build ran in
                "built_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            }
            (out / "build.json").write_text(json.dumps(record, indent=1) + "\n")
            out.chmod(0o755)
            out.rename(final)
        finally:
            shutil.rmtree(out, ignore_errors=True)


def build_driver(
    cache: Path, package_version: str, kernel: KernelFiles, flavor: str = "proprietary"
) -> Driver:
    """The NVIDIA modules of ``flavor`` at Debian version ``package_version`` built against
    ``kernel``, unsigned and stripped, built once per cache."""
    cache.mkdir(parents=True, exist_ok=True)
    version = package_version.rsplit("-", 1)[0]
    final = cache / f"nvidia-{flavor}-{package_version}-{kernel.release}-r{RECIPE}"
    failed = final.with_name(final.name + ".failed")  # a build that failed: its error, kept
    cached = final.is_dir()
    if not cached:
        if failed.is_file():
            raise BuildError(f"{failed.read_text()}\n(cached in {failed}; remove it to retry)")
        package = deb(cache, PACKAGES[flavor], package_version)
        with open(cache / "nvidia-build.lock", "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            if not final.is_dir():
                try:
                    _build(cache, final, package, kernel, package_version)
                except BuildError as exc:
                    if "NVIDIA build against" in str(exc):  # make failed: the source's verdict
                        failed.write_text(str(exc))
                    raise
    build = json.loads((final / "build.json").read_text())
    modules = {name: final / f"{name}.ko" for name in MODULE_NAMES}
    return Driver(flavor, version, kernel.release, modules, final / "Module.symvers", build, cached)


def _unpacked_once(
    cache: Path, final: Path, packages: list[Path], take: Callable[[Path, Path], None]
) -> Path:
    """``final``, made once from ``packages`` unpacked together by ``take(unpacked, dest)``."""
    if final.is_dir():
        return final
    with open(cache / "nvidia-build.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if final.is_dir():
            return final
        work = Path(tempfile.mkdtemp(prefix="nvidia-unpack-", dir=cache))
        try:
            for package in packages:
                extract(package, work / "deb")
            take(work / "deb", work / "out")
            (work / "out").rename(final)
        finally:
            shutil.rmtree(work, ignore_errors=True)
    return final


def gsp_firmware(cache: Path, package_version: str) -> Path:
    """A directory holding ``nvidia/<version>/gsp_*.bin`` from ``firmware-nvidia-gsp``."""

    def take(unpacked: Path, dest: Path) -> None:
        [firmware] = [d for d in ("lib", "usr/lib") if (unpacked / d / "firmware").is_dir()]
        (unpacked / firmware / "firmware").rename(dest)

    cache.mkdir(parents=True, exist_ok=True)
    final = cache / f"nvidia-gsp-{package_version}"
    if final.is_dir():
        return final
    return _unpacked_once(cache, final, [deb(cache, FIRMWARE_PACKAGE, package_version)], take)


def nvidia_smi(cache: Path, package_version: str) -> Path:
    """A directory holding ``nvidia-smi`` and ``libnvidia-ml.so.1`` (the NVML library it
    loads) of Debian version ``package_version``, side by side."""

    def take(unpacked: Path, dest: Path) -> None:
        dest.mkdir()
        found = [p for p in unpacked.rglob("nvidia-smi") if p.is_file() and not p.is_symlink()]
        found += [
            p for p in unpacked.rglob("libnvidia-ml.so.*") if p.is_file() and not p.is_symlink()
        ]
        if not any(p.name == "nvidia-smi" for p in found) or len(found) < 2:
            raise BuildError(
                f"nvidia-smi {package_version}: no nvidia-smi or libnvidia-ml in the packages"
            )
        for path in found:
            shutil.copy2(path, dest / path.name)
        [library] = [p for p in dest.iterdir() if p.name.startswith("libnvidia-ml.so.")]
        if library.name != "libnvidia-ml.so.1":
            (dest / "libnvidia-ml.so.1").symlink_to(library.name)

    cache.mkdir(parents=True, exist_ok=True)
    final = cache / f"nvidia-smi-{package_version}"
    if final.is_dir():
        return final
    packages = [deb(cache, package, package_version) for package in SMI_PACKAGES]
    return _unpacked_once(cache, final, packages, take)

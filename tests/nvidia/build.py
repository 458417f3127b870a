"""NVIDIA's kernel modules built from Debian's source packages, as DKMS builds them.

``nvidia-kernel-source`` (the proprietary driver: an open interface layer linked with
NVIDIA's binary object) or ``nvidia-open-kernel-source`` (the open GPU kernel modules) is
fetched (:mod:`tests.nvidia.archive`), its source tarball unpacked, and kbuild run through
NVIDIA's Makefile with ``SYSSRC=`` the ``-common`` headers and ``SYSOUT=`` the ``-amd64``
ones, which is how DKMS builds them on a Debian host; then, as DKMS does before it signs and
installs a module (Debian's ``nvidia-kernel-dkms`` sets no ``STRIP[]=no``), each module is
stripped of its debug sections with ``strip -g`` (550's ``nvidia-uvm.ko`` goes from about
55 MB to 4 MB, its ``nvidia.ko`` from 99 MB to 88 MB). The unsigned modules, the build's
``Module.symvers`` and ``build.json`` (how long it took, on how many CPUs, at what load)
are kept in ``<cache>/nvidia-<flavor>-<version>-<release>``; the GSP firmware of the same
version from ``firmware-nvidia-gsp`` in ``<cache>/nvidia-gsp-<version>``. A second run
costs a directory lookup.

For a kernel whose headers and compiler live in a Debian root of their own (Debian 13's 6.12
and its gcc-14, sid's 7.2 and its gcc-16; tests/vm/harness/debian.py), the source is unpacked inside that root and
``make`` runs there under ``chroot``; NVIDIA's Makefile takes the compiler the kernel was
built with from its ``CONFIG_CC_VERSION_TEXT``, as it does under DKMS. Processes building at
once serialise on a lock of their own (the small test modules' lock is not held through a
two-minute build).
"""

from __future__ import annotations

import fcntl
import json
import os
import shutil
import subprocess
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from tests.kmod.build import HEADERS, cache_root, kernel_release
from tests.nvidia.archive import deb, extract
from tests.vm.harness.debian import CHROOT_ENV, chroot_argv

# Load order: nvidia first; modeset, uvm and peermem import from it; drm from modeset.
MODULE_NAMES = ("nvidia", "nvidia-modeset", "nvidia-uvm", "nvidia-drm", "nvidia-peermem")
PACKAGES = {"proprietary": "nvidia-kernel-source", "open": "nvidia-open-kernel-source"}
FIRMWARE_PACKAGE = "firmware-nvidia-gsp"
DEFAULT_VERSION = "535.261.03-1"  # Debian 12's (bookworm) driver
RECIPE = 2  # bump when the build below changes: the cache key includes it (2: strip -g)


@dataclass(frozen=True)
class Driver:
    """One built, unsigned NVIDIA driver and how long its build took."""

    flavor: str  # proprietary | open
    version: str  # the driver's version, e.g. 535.261.03
    kernel: str  # the release it was built against
    modules: dict[str, Path]  # name -> unsigned .ko, in load order
    symvers: Path  # the build's Module.symvers (the driver's own exports)
    build: dict[str, object]  # build.json: seconds, cpus, load averages, commands

    @property
    def firmware(self) -> Path:
        """The GSP firmware directory of the same version (``nvidia/<version>/gsp_*.bin``
        below it), fetched on first use."""
        return gsp_firmware(self.package_version)

    @property
    def package_version(self) -> str:
        """The Debian package version the driver was built from (``535.261.03-1``)."""
        return str(self.build["package_version"])


def _headers(release: str, root: Path) -> tuple[Path, Path]:
    """``(SYSSRC, SYSOUT)``: the ``-common`` source headers and the ``-amd64`` build ones, as
    paths seen from ``root``."""
    sysout = HEADERS / f"linux-headers-{release}"
    sysrc = HEADERS / f"linux-headers-{release.rsplit('-', 1)[0]}-common"
    for path in (sysout, sysrc):
        if not (root / path.relative_to("/") / "Makefile").is_file():
            raise RuntimeError(
                f"no kernel headers at {root / path.relative_to('/')}: install "
                f"linux-headers-{release} (see .ci/install)"
            )
    return sysrc, sysout


def _in_root(source: Path, root: Path, argv: list[str]) -> tuple[list[str], dict[str, str]]:
    """``argv`` to run in ``source`` with ``root``'s own tools, compiler and glibc (under
    ``chroot`` unless ``root`` is this machine's): (command, environment)."""
    if root == Path("/"):
        env = {k: v for k, v in os.environ.items() if not k.startswith(("MAKE", "MFLAGS"))}
        return argv, env
    inside = "/" + str(source.relative_to(root))
    return chroot_argv(root, ["sh", "-c", 'cd "$0" && exec "$@"', inside, *argv]), CHROOT_ENV


def _run_make(source: Path, release: str, log: Path, root: Path) -> list[str]:
    sysrc, sysout = _headers(release, root)
    argv = ["make", f"-j{os.cpu_count() or 1}", f"SYSSRC={sysrc}", f"SYSOUT={sysout}", "modules"]
    command, env = _in_root(source, root, argv)
    with log.open("w") as out:
        proc = subprocess.run(
            command, cwd=source, env=env, stdout=out, stderr=subprocess.STDOUT, check=False
        )
    if proc.returncode != 0:
        tail = log.read_text(errors="replace")[-4000:]
        raise RuntimeError(f"NVIDIA build against {release} failed ({proc.returncode}):\n{tail}")
    return argv


def _strip(source: Path, root: Path) -> list[str]:
    """``strip -g`` every module as DKMS does after its build (dkms's ``STRIP[#]`` defaults to
    yes), with the root's own binutils; the command run."""
    argv = ["strip", "-g", *(f"{name}.ko" for name in MODULE_NAMES)]
    command, env = _in_root(source, root, argv)
    proc = subprocess.run(command, cwd=source, env=env, capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        raise RuntimeError(f"strip -g in {source} failed ({proc.returncode}): {proc.stderr}")
    return argv


def _build(final: Path, package: Path, release: str, package_version: str, root: Path) -> None:
    scratch = cache_root() if root == Path("/") else root / "tmp"
    work = Path(tempfile.mkdtemp(prefix="nvidia-build-", dir=scratch))
    out = Path(tempfile.mkdtemp(prefix="nvidia-out-", dir=cache_root()))  # renamed to final
    try:
        unpacked = extract(package, work / "deb")
        [tarball] = (unpacked / "usr/src").glob("nvidia*.tar.xz")
        (work / "src").mkdir()
        subprocess.run(["tar", "-xJf", str(tarball), "-C", str(work / "src")], check=True)
        source = min(
            (p.parent for p in (work / "src").rglob("Kbuild") if (p.parent / "Makefile").is_file()),
            key=lambda p: len(p.parts),
        )
        load_before = os.getloadavg()
        started = time.monotonic()
        argv = _run_make(source, release, work / "make.log", root)
        seconds = time.monotonic() - started
        stripped = _strip(source, root)
        for name in MODULE_NAMES:
            shutil.copyfile(source / f"{name}.ko", out / f"{name}.ko")
        shutil.copyfile(source / "Module.symvers", out / "Module.symvers")
        record = {
            "package": package.name,
            "package_version": package_version,
            "kernel": release,
            "seconds": round(seconds, 1),
            "cpus": os.cpu_count(),
            "load_before": [round(x, 2) for x in load_before],
            "load_after": [round(x, 2) for x in os.getloadavg()],
            "command": " ".join(argv),
            "stripped": " ".join(stripped),
            "root": str(root),  # "/", or the Debian root the build ran in under chroot
            "built_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        }
        (out / "build.json").write_text(json.dumps(record, indent=1) + "\n")
        out.chmod(0o755)
        out.rename(final)
    finally:
        shutil.rmtree(work, ignore_errors=True)
        shutil.rmtree(out, ignore_errors=True)


def build_driver(
    package_version: str = DEFAULT_VERSION,
    flavor: str = "proprietary",
    release: str | None = None,
    root: Path | None = None,
) -> Driver:
    """The NVIDIA modules of ``flavor`` at Debian version ``package_version`` built against
    ``release`` (default :func:`tests.kmod.kernel_release`), unsigned, built once per machine.
    ``root``: the Debian root holding that release's headers and compiler (default: this
    machine's own)."""
    release = release or kernel_release()
    root = root or Path("/")
    version = package_version.rsplit("-", 1)[0]
    final = cache_root() / f"nvidia-{flavor}-{package_version}-{release}-r{RECIPE}"
    failed = final.with_name(final.name + ".failed")  # a build that failed: its error, kept
    if not final.is_dir():
        if failed.is_file():
            raise RuntimeError(f"{failed.read_text()}\n(cached in {failed}; remove it to retry)")
        package = deb(PACKAGES[flavor], package_version)
        with open(cache_root() / "nvidia-build.lock", "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            if not final.is_dir():
                try:
                    _build(final, package, release, package_version, root)
                except RuntimeError as exc:
                    if "NVIDIA build against" in str(exc):  # make failed: the source's verdict
                        failed.write_text(str(exc))
                    raise
    build = json.loads((final / "build.json").read_text())
    modules = {name: final / f"{name}.ko" for name in MODULE_NAMES}
    return Driver(flavor, version, release, modules, final / "Module.symvers", build)


def gsp_firmware(package_version: str = DEFAULT_VERSION) -> Path:
    """A directory holding ``nvidia/<version>/gsp_*.bin`` from ``firmware-nvidia-gsp``."""
    final = cache_root() / f"nvidia-gsp-{package_version}"
    if final.is_dir():
        return final
    package = deb(FIRMWARE_PACKAGE, package_version)
    with open(cache_root() / "nvidia-build.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if final.is_dir():
            return final
        work = Path(tempfile.mkdtemp(prefix="nvidia-gsp-", dir=cache_root()))
        try:
            unpacked = extract(package, work / "deb")
            [firmware] = [d for d in ("lib", "usr/lib") if (unpacked / d / "firmware").is_dir()]
            (unpacked / firmware / "firmware").rename(work / "firmware")
            (work / "firmware").rename(final)
        finally:
            shutil.rmtree(work, ignore_errors=True)
    return final

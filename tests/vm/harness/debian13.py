"""Debian 13 (trixie) for the test bed: its signed 6.12 kernel and a Debian 13 root to boot it.

Nothing is installed on the host. A private apt configuration in the cache (its own
sources.list naming the trixie suite, its own lists and status file) resolves
`linux-image-amd64` to a versioned package and `apt-get download`s the signed image, its
headers (`-amd64` and `-common`) and `linux-kbuild-<ver>`. `mmdebstrap` then makes the
node's root: Debian 13's userspace (Python 3.13, systemd 257, kmod 34, gcc-14 for kbuild) with
modstage's runtime dependencies from Debian's packages, the four kernel packages unpacked
into it with `dpkg-deb -x` (their maintainer scripts would build an initramfs nobody boots)
and `depmod` run there. The root is cached under the harness cache, keyed by the packages'
versions and this file's settings; test modules for 6.12 are built and signed inside it
(chroot), with its own gcc-14, kbuild and `sign-file` (trixie's binaries need trixie's glibc).
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import shutil
import subprocess
import tempfile
import zipfile
from pathlib import Path

from .errors import VmSetupError
from .kernel import cache_dir

SUITE = "trixie"
MIRROR = "http://deb.debian.org/debian"
KEYRING = "/usr/share/keyrings/debian-archive-keyring.gpg"
# what a Debian 13 node running modstage has; gcc-14, make, libc6-dev and libssl3t64 build and
# sign the test modules; libelf1t64 is objtool's, dwarves (pahole) adds their BTF
ROOT_PACKAGES = (
    "python3,python3-cryptography,python3-asn1crypto,python3-zstandard,"
    "python3-rich,python3-tomli-w,python3-pyudev,python3-yaml,kmod,systemd,udev,procps,"
    "util-linux,mount,e2fsprogs,xz-utils,zstd,openssl,gcc-14,make,libc6-dev,libssl3t64,"
    "libelf1t64,binutils,dwarves"
)
# modstage pins watchdog>=7.1 (service/daemon/events.py); trixie ships 6.0: its wheel from
# PyPI (pure Python, py3-none) goes into the root's /usr/local
WATCHDOG = "watchdog==7.1.0"


def _apt_dir() -> Path:
    return cache_dir() / f"apt-{SUITE}"


def _apt_options() -> list[str]:
    root = _apt_dir()
    return [
        f"-oDir={root}",
        f"-oDir::State::status={root}/var/lib/dpkg/status",
        "-oDir::Etc::trusted=/etc/apt/trusted.gpg",
        "-oDir::Etc::TrustedParts=/etc/apt/trusted.gpg.d",
        "-oAPT::Architecture=amd64",
        "-oDebug::NoLocking=1",
        "-oAPT::Sandbox::User=root",
    ]


def _run(argv: list[str], **kw: object) -> str:
    done = subprocess.run(argv, capture_output=True, text=True, check=False, **kw)  # type: ignore[call-overload]
    if done.returncode != 0:
        raise VmSetupError(
            f"{' '.join(argv[:4])} failed ({done.returncode}):\n{done.stderr[-3000:]}"
        )
    return str(done.stdout)


def _apt_update() -> None:
    root = _apt_dir()
    for sub in ("etc/apt/apt.conf.d", "etc/apt/preferences.d", "var/lib/apt/lists/partial"):
        (root / sub).mkdir(parents=True, exist_ok=True)
    (root / "var/cache/apt/archives/partial").mkdir(parents=True, exist_ok=True)
    (root / "var/lib/dpkg").mkdir(parents=True, exist_ok=True)
    (root / "var/lib/dpkg/status").touch()
    (root / "etc/apt/sources.list").write_text(f"deb [signed-by={KEYRING}] {MIRROR} {SUITE} main\n")
    _run(["apt-get", *_apt_options(), "-qq", "update"])


def kernel_version() -> tuple[str, str]:
    """(package version, kernel release) of trixie's `linux-image-amd64`, e.g.
    ("6.12.117-1", "6.12.117+deb13-amd64"); `$MODSTAGE_VM_DEBIAN13_KERNEL` pins the release."""
    lists = _apt_dir() / "var/lib/apt/lists"
    if not any(lists.glob("*_Packages*")):  # apt may keep them compressed (.lz4)
        _apt_update()
    shown = _run(["apt-cache", *_apt_options(), "show", "linux-image-amd64"])
    fields = dict(
        line.split(": ", 1) for line in shown.split("\n\n")[0].splitlines() if ": " in line
    )
    release = os.environ.get("MODSTAGE_VM_DEBIAN13_KERNEL") or fields["Depends"].split()[0]
    return fields["Version"], release.removeprefix("linux-image-")


def fetch_debs(release: str) -> list[Path]:
    """The image, both headers and kbuild packages of `release`, downloaded once (cached)."""
    base = release.removesuffix("-amd64")
    names = [
        f"linux-image-{release}",
        f"linux-headers-{release}",
        f"linux-headers-{base}-common",
        f"linux-kbuild-{base}",
    ]
    into = cache_dir() / f"debs-{release}"
    found = [next(iter(sorted(into.glob(f"{name}_*.deb"))), None) for name in names]
    if all(found):
        return [p for p in found if p is not None]
    into.mkdir(parents=True, exist_ok=True)
    _run(["apt-get", *_apt_options(), "-qq", "download", *names], cwd=into)
    return [next(iter(sorted(into.glob(f"{name}_*.deb")))) for name in names]


def _watchdog_wheel(into: Path) -> Path:
    """The watchdog wheel for the root, downloaded once with the host's pip."""
    wheels = cache_dir() / "wheels-debian13"
    found = sorted(wheels.glob("watchdog-*.whl"))
    if not found:
        _run(
            [
                *("python3", "-m", "pip", "download", "--no-deps", "--only-binary=:all:"),
                *("--python-version", "3.13", "--platform", "manylinux2014_x86_64"),
                *("-d", str(wheels), WATCHDOG),
            ]
        )
        found = sorted(wheels.glob("watchdog-*.whl"))
    return found[-1]


def root() -> Path:
    """The Debian 13 root with the 6.12 kernel in it, built once per kernel version (cached)."""
    version, release = kernel_version()
    key = hashlib.sha256(f"{version}\0{release}\0{ROOT_PACKAGES}\0{WATCHDOG}".encode()).hexdigest()[
        :16
    ]
    final = cache_dir() / f"root-{SUITE}-{key}"
    if (final / ".complete").exists():
        return final
    with open(cache_dir() / f"root-{SUITE}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if (final / ".complete").exists():
            return final
        debs = fetch_debs(release)
        wheel = _watchdog_wheel(final.parent)
        work = Path(tempfile.mkdtemp(prefix=f"root-{SUITE}-", dir=cache_dir()))
        try:
            _build(work / "root", debs, release)
            site = work / "root/usr/local/lib/python3.13/dist-packages"
            site.mkdir(parents=True, exist_ok=True)
            with zipfile.ZipFile(wheel) as archive:
                archive.extractall(site)
            shutil.rmtree(final, ignore_errors=True)
            (work / "root").rename(final)
            (final / ".complete").write_text(f"{version} {release}\n")
        finally:
            shutil.rmtree(work, ignore_errors=True)
    return final


def _build(into: Path, debs: list[Path], release: str) -> None:
    unpack = " && ".join(f'dpkg-deb -x "{deb}" "$1"' for deb in debs)
    _run(
        [
            "mmdebstrap",
            "--variant=minbase",
            f"--include={ROOT_PACKAGES}",
            "--customize-hook=" + unpack,
            f'--customize-hook=chroot "$1" depmod {release}',
            '--customize-hook=rm -rf "$1"/var/cache/apt/archives/*.deb "$1"/var/lib/apt/lists/*',
            SUITE,
            str(into),
            MIRROR,
        ],
        timeout=1800,
    )


# a fresh Debian 13 host as a user installs modstage on it: Python 3.13 with venv (PEP 668:
# the system Python is externally managed), systemd 257 (systemd-analyze scores the units)
INSTALL_PACKAGES = "python3,python3-venv,systemd"


def install_root() -> Path:
    """A minimal Debian 13 root for the installer's tests (no kernel), built once (cached)."""
    key = hashlib.sha256(INSTALL_PACKAGES.encode()).hexdigest()[:16]
    final = cache_dir() / f"install-root-{SUITE}-{key}"
    if (final / ".complete").exists():
        return final
    with open(cache_dir() / f"install-root-{SUITE}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if (final / ".complete").exists():
            return final
        work = Path(tempfile.mkdtemp(prefix=f"install-root-{SUITE}-", dir=cache_dir()))
        try:
            _run(
                [
                    *("mmdebstrap", "--variant=minbase", f"--include={INSTALL_PACKAGES}"),
                    '--customize-hook=rm -rf "$1"/var/cache/apt/archives/*.deb'
                    ' "$1"/var/lib/apt/lists/*',
                    *(SUITE, str(work / "root"), MIRROR),
                ],
                timeout=1800,
            )
            shutil.rmtree(final, ignore_errors=True)
            (work / "root").rename(final)
            (final / ".complete").write_text(INSTALL_PACKAGES + "\n")
        finally:
            shutil.rmtree(work, ignore_errors=True)
    return final


#: The environment a command run under `chroot` in the root gets (none of the host's).
CHROOT_ENV = {"PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "LANG": "C.UTF-8", "HOME": "/root"}


def chroot(root_dir: Path, argv: list[str], **kw: object) -> str:
    """Run `argv` inside the Debian 13 root (its own tools and glibc); stdout, or VmSetupError."""
    return _run(["chroot", str(root_dir), *argv], env=CHROOT_ENV, **kw)


def main() -> int:
    """`python -m tests.vm.harness.debian13`: fetch the packages and build both roots now."""
    version, release = kernel_version()
    print(f"debian13: linux-image-amd64 {version} ({release}) in {root()}")
    print(f"debian13: install root (python3, python3-venv, systemd) in {install_root()}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

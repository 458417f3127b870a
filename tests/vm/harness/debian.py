"""Debian's newer suites for the test bed: a signed kernel and a root to boot it, per suite.

Two suites are known (`SUITES`): Debian 13 (trixie) with its 6.12 and Debian's development
suite (sid) with its 7.2. Nothing is installed on the host. A private apt configuration per
suite in the cache (its own sources.list naming the suite, its own lists and status file)
resolves `linux-image-amd64` to a versioned package and `apt-get download`s the signed kernel
(on 7.2 the image package is a metapackage: its `linux-base-`, `linux-binary-` and
`linux-modules-` packages are downloaded with it), its headers (`-amd64` and `-common`) and
`linux-kbuild-<ver>`. `mmdebstrap` then makes the node's root: the suite's userspace (Python,
systemd, kmod, the gcc its kernel was built with) with modstage's runtime dependencies from
Debian's packages, the kernel packages unpacked into it with `dpkg-deb -x` (their maintainer
scripts would build an initramfs nobody boots) and `depmod` run there. The root is cached
under the harness cache, keyed by the packages' versions and the suite's settings; test
modules for the suite's kernel are built and signed inside it (chroot), with its own gcc,
kbuild and `sign-file` (the suite's binaries need the suite's glibc).
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import re
import shutil
import subprocess
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from .errors import VmSetupError
from .kernel import cache_dir

MIRROR = "http://deb.debian.org/debian"
KEYRING = "/usr/share/keyrings/debian-archive-keyring.gpg"
# what a node running modstage has; `{gcc}`, make, libc6-dev and libssl3t64 build and sign the
# test modules; libelf1t64 is objtool's, dwarves (pahole) adds their BTF
_ROOT_PACKAGES = (
    "python3,python3-cryptography,python3-asn1crypto,python3-zstandard,"
    "python3-rich,python3-tomli-w,python3-pyudev,python3-structlog,python3-yaml,python3-watchdog,"
    "kmod,systemd,"
    "udev,procps,"
    "util-linux,mount,e2fsprogs,xz-utils,zstd,openssl,{gcc},make,libc6-dev,libssl3t64,"
    "libelf1t64,binutils,dwarves"
)


@dataclass(frozen=True)
class Suite:
    """One Debian suite the test bed takes a kernel and a root from."""

    name: str  # the archive's suite name: "trixie", "sid"
    series: str  # the upstream series of its linux-image-amd64: "6.12", "7.2"
    python: str  # its python3's version
    gcc: str  # the compiler its kernel was built with (the headers' CONFIG_CC_VERSION_TEXT)
    components: str = "main"
    env_pin: str = ""  # an environment variable that pins the kernel release, if any
    # sid's Release file carries a Valid-Until a week ahead; the archive this test bed reaches
    # can hold one past it, which apt refuses unless told the date is not checked
    stale_release_ok: bool = False

    @property
    def apt_options(self) -> list[str]:
        """apt options that depend on the suite (given to apt-get and to mmdebstrap)."""
        return ["-oAcquire::Check-Valid-Until=false"] if self.stale_release_ok else []

    @property
    def root_packages(self) -> str:
        """What mmdebstrap installs into the suite's root."""
        return _ROOT_PACKAGES.format(gcc=self.gcc)


TRIXIE = Suite("trixie", "6.12", "3.13", "gcc-14", env_pin="MODSTAGE_VM_DEBIAN13_KERNEL")
SID = Suite(
    *("sid", "7.2", "3.14", "gcc-16"),
    components="main non-free",
    env_pin="MODSTAGE_VM_SID_KERNEL",
    stale_release_ok=True,
)
SUITES = {suite.series: suite for suite in (TRIXIE, SID)}
#: the suite of the installer's tests (tests/installer.py, `install_root`)
SUITE = TRIXIE.name


def _apt_dir(suite: Suite = TRIXIE) -> Path:
    return cache_dir() / f"apt-{suite.name}"


def _apt_options(suite: Suite = TRIXIE) -> list[str]:
    root = _apt_dir(suite)
    return [
        f"-oDir={root}",
        f"-oDir::State::status={root}/var/lib/dpkg/status",
        "-oDir::Etc::trusted=/etc/apt/trusted.gpg",
        "-oDir::Etc::TrustedParts=/etc/apt/trusted.gpg.d",
        "-oAPT::Architecture=amd64",
        "-oDebug::NoLocking=1",
        "-oAPT::Sandbox::User=root",
        *suite.apt_options,
    ]


def _run(argv: list[str], *, shown: list[str] | None = None, **kw: object) -> str:
    """Run `argv`; its stdout, or VmSetupError naming `shown` (default: argv) and stderr."""
    done = subprocess.run(argv, capture_output=True, text=True, check=False, **kw)  # type: ignore[call-overload]
    if done.returncode != 0:
        said = " ".join((shown or argv)[:4])
        raise VmSetupError(f"{said} failed ({done.returncode}):\n{done.stderr[-3000:]}")
    return str(done.stdout)


def _apt_update(suite: Suite = TRIXIE) -> None:
    root = _apt_dir(suite)
    for sub in ("etc/apt/apt.conf.d", "etc/apt/preferences.d", "var/lib/apt/lists/partial"):
        (root / sub).mkdir(parents=True, exist_ok=True)
    (root / "var/cache/apt/archives/partial").mkdir(parents=True, exist_ok=True)
    (root / "var/lib/dpkg").mkdir(parents=True, exist_ok=True)
    (root / "var/lib/dpkg/status").touch()
    (root / "etc/apt/sources.list").write_text(
        f"deb [signed-by={KEYRING}] {MIRROR} {suite.name} {suite.components}\n"
    )
    _run(["apt-get", *_apt_options(suite), "-qq", "update"])


def _lists_ready(suite: Suite) -> None:
    lists = _apt_dir(suite) / "var/lib/apt/lists"
    if not any(lists.glob("*_Packages*")):  # apt may keep them compressed (.lz4)
        _apt_update(suite)


def _fields(suite: Suite, package: str) -> dict[str, str]:
    shown = _run(["apt-cache", *_apt_options(suite), "show", package])
    return dict(line.split(": ", 1) for line in shown.split("\n\n")[0].splitlines() if ": " in line)


def kernel_version(suite: Suite = TRIXIE) -> tuple[str, str]:
    """(package version, kernel release) of the suite's `linux-image-amd64`, e.g.
    ("6.12.117-1", "6.12.117+deb13-amd64"); the suite's `env_pin` variable pins the release."""
    _lists_ready(suite)
    fields = _fields(suite, "linux-image-amd64")
    images = re.findall(r"linux-image-(\S+-amd64)\b", fields["Depends"])
    if not images:
        raise VmSetupError(f"{suite.name}'s linux-image-amd64 depends on no image: {fields}")
    release = (os.environ.get(suite.env_pin) if suite.env_pin else None) or images[0]
    return fields["Version"], release.removeprefix("linux-image-")


def kernel_packages(release: str, suite: Suite = TRIXIE) -> list[str]:
    """The packages that make up `release`'s kernel and headers: the image package and the
    `linux-base-`, `linux-binary-` and `linux-modules-` packages it depends on (7.2's split),
    both headers packages and the kbuild package."""
    base = release.removesuffix("-amd64")
    image = f"linux-image-{release}"
    _lists_ready(suite)
    parts = re.findall(
        rf"(linux-(?:base|binary|modules)-{re.escape(release)})\b",
        _fields(suite, image).get("Depends", ""),
    )
    return [
        image,
        *dict.fromkeys(parts),
        f"linux-headers-{release}",
        f"linux-headers-{base}-common",
        f"linux-kbuild-{base}",
    ]


def fetch_debs(release: str, suite: Suite = TRIXIE) -> list[Path]:
    """The kernel's, both headers' and kbuild's packages of `release`, downloaded once (cached)."""
    names = kernel_packages(release, suite)
    into = cache_dir() / f"debs-{release}"
    found = [next(iter(sorted(into.glob(f"{name}_*.deb"))), None) for name in names]
    if all(found):
        return [p for p in found if p is not None]
    into.mkdir(parents=True, exist_ok=True)
    _run(["apt-get", *_apt_options(suite), "-qq", "download", *names], cwd=into)
    return [next(iter(sorted(into.glob(f"{name}_*.deb")))) for name in names]


def built_once(final: Path, name: str, make: Callable[[Path], str]) -> Path:
    """`final`, a tree `make(tree)` builds at `tree` (returning what `.complete` records),
    built once: under a lock of `name` in the cache, in a scratch directory renamed into
    place, so that concurrent runs wait for one build and never see half a tree."""
    if (final / ".complete").exists():
        return final
    with open(cache_dir() / f"{name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if (final / ".complete").exists():
            return final
        work = Path(tempfile.mkdtemp(prefix=f"{name}-", dir=cache_dir()))
        try:
            complete = make(work / "tree")
            shutil.rmtree(final, ignore_errors=True)
            (work / "tree").rename(final)
            (final / ".complete").write_text(complete + "\n")
        finally:
            shutil.rmtree(work, ignore_errors=True)
    return final


def root(suite: Suite = TRIXIE) -> Path:
    """The suite's root with its kernel in it, built once per kernel version (cached)."""
    version, release = kernel_version(suite)
    packages = suite.root_packages
    key = hashlib.sha256(f"{version}\0{release}\0{packages}".encode()).hexdigest()[:16]

    def make(tree: Path) -> str:
        _build(tree, fetch_debs(release, suite), release, suite)
        return f"{version} {release}"

    return built_once(cache_dir() / f"root-{suite.name}-{key}", f"root-{suite.name}", make)


def _aptopt(option: str) -> str:
    """`-oName=value` as mmdebstrap's --aptopt, which takes apt.conf syntax."""
    name, value = option.removeprefix("-o").split("=", 1)
    return f'--aptopt={name} "{value}"'


def _build(into: Path, debs: list[Path], release: str, suite: Suite) -> None:
    unpack = " && ".join(f'dpkg-deb -x "{deb}" "$1"' for deb in debs)
    _run(
        [
            "mmdebstrap",
            "--variant=minbase",
            *(_aptopt(option) for option in suite.apt_options),
            f"--include={suite.root_packages}",
            "--customize-hook=" + unpack,
            f'--customize-hook=chroot "$1" depmod {release}',
            '--customize-hook=rm -rf "$1"/var/cache/apt/archives/*.deb "$1"/var/lib/apt/lists/*',
            suite.name,
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

    def make(tree: Path) -> str:
        _run(
            [
                *("mmdebstrap", "--variant=minbase", f"--include={INSTALL_PACKAGES}"),
                '--customize-hook=rm -rf "$1"/var/cache/apt/archives/*.deb'
                ' "$1"/var/lib/apt/lists/*',
                *(SUITE, str(tree), MIRROR),
            ],
            timeout=1800,
        )
        return INSTALL_PACKAGES

    final = cache_dir() / f"install-root-{SUITE}-{key}"
    return built_once(final, f"install-root-{SUITE}", make)


#: The environment a command run under `chroot` in the root gets (none of the host's).
CHROOT_ENV = {"PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "LANG": "C.UTF-8", "HOME": "/root"}


def chroot_argv(root_dir: Path, argv: list[str]) -> list[str]:
    """`argv` to run inside a suite's root with /proc mounted there, in a mount namespace of
    its own (7.2's objtool reads /proc/self/limits; nothing is left mounted on the host)."""
    inner = 'mount -t proc proc "$0/proc" && exec chroot "$0" "$@"'
    unshare = ["unshare", "--mount", "--propagation", "private", "--", "sh", "-c", inner]
    return [*unshare, str(root_dir), *argv]


def chroot(root_dir: Path, argv: list[str], **kw: object) -> str:
    """Run `argv` inside a suite's root (its own tools and glibc, see `chroot_argv`); stdout,
    or VmSetupError."""
    shown = ["chroot", str(root_dir), *argv]
    return _run(chroot_argv(root_dir, argv), shown=shown, env=CHROOT_ENV, **kw)


def main() -> int:
    """`python -m tests.vm.harness.debian [SERIES...]`: fetch the packages and build the roots
    of the named kernel series (default: the suites `MODSTAGE_KERNELS` names) now."""
    import sys

    from .kernel import kernel_series

    series = sys.argv[1:] or [s for s in kernel_series() if s in SUITES]
    for name in series:
        suite = SUITES[name]
        version, release = kernel_version(suite)
        print(f"{suite.name}: linux-image-amd64 {version} ({release}) in {root(suite)}")
    if TRIXIE.series in series:
        print(f"trixie: install root (python3, python3-venv, systemd) in {install_root()}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""Test modules for each guest kernel: built against its own headers, signed with its own
`sign-file`.

Debian 12's 6.1 uses the host's headers and kbuild (tests/kmod). Debian 13's 6.12 and sid's 7.2
have their headers, kbuild and gcc (14, 16) inside their roots (debian.py), whose binaries
need their suite's glibc:
the sources are copied into the root and `make` and `sign-file` run there under chroot. Builds
are cached like tests/kmod's, keyed by the release and the sources' digest.
"""

from __future__ import annotations

import fcntl
import shutil
import tempfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import tests.kmod
from tests.kmod.build import MODULE_NAMES, SRC, _source_digest, build_once, cache_root

from . import debian
from .kernel import Kernel


def sign_file(kernel: Kernel) -> Path:
    """The kernel's own `scripts/sign-file`, as a path inside its root."""
    base = kernel.release.removesuffix("-amd64")
    return Path(f"/usr/lib/linux-kbuild-{base}/scripts/sign-file")


@contextmanager
def _scratch(kernel: Kernel) -> Iterator[tuple[Path, str]]:
    """A fresh directory inside the kernel's root: (host path, path seen from the chroot)."""
    host = Path(tempfile.mkdtemp(prefix="modstage-", dir=kernel.root / "tmp"))
    try:
        yield host, f"/tmp/{host.name}"
    finally:
        shutil.rmtree(host, ignore_errors=True)


def _copy_sources(into: Path, src: Path = SRC) -> None:
    for path in src.iterdir():
        if path.is_file():
            shutil.copy2(path, into / path.name)


def build_modules(kernel: Kernel) -> dict[str, Path]:
    """Module name -> UNSIGNED `.ko` built against `kernel`'s headers (cached on disk)."""
    if not kernel.own_root:
        return tests.kmod.build_modules()
    final = cache_root() / f"modules-{kernel.release}-{_source_digest(kernel.release)}"
    build_tree(kernel, final, _copy_sources)
    return {name: final / f"{name}.ko" for name in MODULE_NAMES}


def build_tree(
    kernel: Kernel,
    final: Path,
    fill: Callable[[Path], None],
    finish: Callable[[Path], None] | None = None,
) -> Path:
    """The directory `final` holding the `.ko` files of a kbuild tree (sources written by
    `fill(dir)`, post-processed by `finish(dir)`) built once against `kernel`'s headers."""
    if not kernel.own_root:
        return build_once(final, fill, finish=finish)
    if final.is_dir():
        return final
    with open(cache_root() / "build.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if final.is_dir():
            return final
        with _scratch(kernel) as (host, inside):
            fill(host)
            headers = f"/usr/src/linux-headers-{kernel.release}"
            debian.chroot(kernel.root, ["make", "-C", headers, f"M={inside}", "modules"])
            if finish is not None:
                finish(host)
            work = Path(tempfile.mkdtemp(prefix="build-", dir=cache_root()))
            for ko in host.glob("*.ko"):
                shutil.copy2(ko, work / ko.name)
            work.rename(final)
    return final


def sign_in_root(kernel: Kernel, argv: list[str], files: list[Path], target: Path) -> None:
    """Run `kernel`'s sign-file with `argv` (paths among `files` given by name) on `target`
    inside its root, and copy the signed result back onto `target`."""
    with _scratch(kernel) as (host, inside):
        for path in (*files, target):
            shutil.copyfile(path, host / path.name)
        names = {path.name for path in files}
        inner = [f"{inside}/{word}" if word in names else word for word in argv]
        debian.chroot(kernel.root, [str(sign_file(kernel)), *inner, f"{inside}/{target.name}"])
        shutil.copyfile(host / target.name, target)


def sign(
    kernel: Kernel,
    module: Path,
    key: tests.kmod.SigningKey,
    out: Path,
    *,
    hash: str = "sha256",
    skid: bool = False,
) -> Path:
    """Copy `module` to `out` signed with `kernel`'s own `sign-file` (`-k`: by SKID)."""
    if not kernel.own_root:
        return tests.kmod.sign(module, key, out, hash=hash, skid=skid)
    shutil.copyfile(module, out)
    argv = [*(["-k"] if skid else []), hash, key.key.name, key.cert_pem.name]
    sign_in_root(kernel, argv, [key.key, key.cert_pem], out)
    return out

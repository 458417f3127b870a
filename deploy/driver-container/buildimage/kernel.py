"""One target kernel's files: its headers, ``sign-file``, compiler, image and in-tree modules.

A kernel is named by its release and the root holding its Debian packages
(``linux-headers-<release>``, ``linux-image-<release>`` and the compiler it was built
with): ``/`` when this machine runs that Debian release, or a Debian root of that release's
own (``mmdebstrap``, see deploy/README.md) for another. Commands that must use the kernel's
own tools (``make``, ``strip``, ``sign-file``) run in that root under ``chroot``, in a mount
namespace of their own with ``/proc`` mounted there; nothing stays mounted afterwards.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from buildimage import BuildError

CHROOT_ENV = {"PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "LANG": "C.UTF-8", "HOME": "/root"}


def chroot_argv(root: Path, argv: list[str]) -> list[str]:
    """``argv`` to run inside ``root`` with ``/proc`` mounted there, in a mount namespace of
    its own (some kernels' objtool reads ``/proc/self/limits``)."""
    inner = 'mount -t proc proc "$0/proc" && exec chroot "$0" "$@"'
    unshare = ["unshare", "--mount", "--propagation", "private", "--", "sh", "-c", inner]
    return [*unshare, str(root), *argv]


@dataclass(frozen=True)
class KernelFiles:
    """Kernel ``release`` as Debian installs it under ``root``."""

    release: str
    root: Path = Path("/")

    @classmethod
    def from_arg(cls, text: str) -> KernelFiles:
        """``RELEASE`` (this machine's root) or ``RELEASE=ROOT``."""
        release, _, root = text.partition("=")
        return cls(release, Path(root or "/").resolve())

    @property
    def own_root(self) -> bool:
        """Whether the kernel's files live in a root other than this machine's."""
        return self.root != Path("/")

    def at(self, absolute: str | Path) -> Path:
        """``absolute`` (a path as the root sees it) on this machine."""
        return self.root / str(absolute).lstrip("/")

    @property
    def headers(self) -> tuple[Path, Path]:
        """``(SYSSRC, SYSOUT)`` as the root sees them: the ``-common`` headers and the
        ``-amd64`` build ones; :class:`BuildError` when they are not installed."""
        sysout = Path("/usr/src") / f"linux-headers-{self.release}"
        sysrc = Path("/usr/src") / f"linux-headers-{self.release.rsplit('-', 1)[0]}-common"
        for path in (sysout, sysrc):
            if not (self.at(path) / "Makefile").is_file():
                raise BuildError(
                    f"kernel {self.release}: no headers at {self.at(path)} "
                    f"(install linux-headers-{self.release} in {self.root})"
                )
        return sysrc, sysout

    @property
    def sign_file(self) -> Path:
        """The kernel's own ``scripts/sign-file``, as the root sees it."""
        return Path("/usr/src") / f"linux-headers-{self.release}" / "scripts/sign-file"

    def command(self, cwd: Path, argv: list[str]) -> tuple[list[str], dict[str, str]]:
        """``argv`` to run in ``cwd`` (a path on this machine, inside the root) with the root's
        own tools, compiler and C library: (command, environment)."""
        if not self.own_root:
            env = {k: v for k, v in os.environ.items() if not k.startswith(("MAKE", "MFLAGS"))}
            return argv, env
        inside = "/" + str(cwd.relative_to(self.root))
        return chroot_argv(
            self.root, ["sh", "-c", 'cd "$0" && exec "$@"', inside, *argv]
        ), CHROOT_ENV

    def run(self, cwd: Path, argv: list[str], what: str) -> str:
        """Run ``argv`` in ``cwd`` with the root's tools; stdout, or :class:`BuildError`."""
        command, env = self.command(cwd, argv)
        done = subprocess.run(
            command, cwd=cwd, env=env, capture_output=True, text=True, check=False
        )
        if done.returncode != 0:
            raise BuildError(
                f"kernel {self.release}: {what} failed ({done.returncode}): "
                f"{(done.stderr or done.stdout).strip()[-2000:]}"
            )
        return done.stdout

    @contextmanager
    def scratch(self, under: Path) -> Iterator[Path]:
        """A fresh directory the root's tools can see (in its ``/tmp``, or under ``under``
        for this machine's root), removed afterwards."""
        parent = self.at("/tmp") if self.own_root else under
        parent.mkdir(parents=True, exist_ok=True)
        path = Path(tempfile.mkdtemp(prefix="modstage-build-", dir=parent))
        try:
            yield path
        finally:
            shutil.rmtree(path, ignore_errors=True)

    def install_target(self, into: Path) -> Path:
        """A host root under ``into`` whose target is this kernel, whole, as ``modstage
        verify --root`` reads it: the image and in-tree module tree linked, the
        configuration, ``modules.dep``, the built-in lists and ``Module.symvers`` copied.
        Returns ``into``."""
        real = self.at(f"/lib/modules/{self.release}")
        modules = into / "lib/modules" / self.release
        (modules / "build").mkdir(parents=True, exist_ok=True)
        missing = [
            p for p in (real / "kernel", self.at(f"/boot/vmlinuz-{self.release}")) if not p.exists()
        ]
        if missing:
            raise BuildError(
                f"kernel {self.release}: no {', '.join(map(str, missing))} "
                f"(install linux-image-{self.release} in {self.root}: verify reads its exports)"
            )
        if not (modules / "kernel").is_symlink():
            (modules / "kernel").symlink_to(real / "kernel")
        for name in ("modules.dep", "modules.builtin", "modules.builtin.modinfo", "modules.order"):
            _copy(real / name, modules / name)
        _copy(
            self.at(f"/usr/src/linux-headers-{self.release}/Module.symvers"),
            modules / "build/Module.symvers",
        )
        boot = into / "boot"
        boot.mkdir(parents=True, exist_ok=True)
        if not (boot / f"vmlinuz-{self.release}").is_symlink():
            (boot / f"vmlinuz-{self.release}").symlink_to(self.at(f"/boot/vmlinuz-{self.release}"))
        _copy(self.at(f"/boot/config-{self.release}"), boot / f"config-{self.release}")
        return into


def _copy(source: Path, dest: Path) -> None:
    """Copy unless ``dest`` already holds the same bytes (a kept target's files keep their
    times, so modstage's exports cache for it stays valid)."""
    data = source.read_bytes()
    if not dest.is_file() or dest.read_bytes() != data:
        dest.write_bytes(data)

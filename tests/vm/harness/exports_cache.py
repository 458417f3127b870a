"""The target kernel's exports cache, built once on the host and given to every node.

Intake builds ``/var/lib/modstage/cache/exports-<release>`` from the kernel's own files on
its first run (service/verify/targetkernel/exports.py): about 2 s on real hardware, but one to three
minutes in a TCG guest reading 4,000 modules over 9p. The guest's root is the host's, so
the cache the host builds from the same files is the one the guest would build (it is
keyed by paths, sizes and modification times, which 9p passes through): each node's state
starts with a copy, as a node that has taken a drop in before would have it. A kernel with a
root of its own (Debian 13's) has its cache built by a child process chrooted into that root,
so that the paths in the key are the ones the guest sees.
"""

from __future__ import annotations

import importlib
import os
import shutil
import tempfile
from pathlib import Path

from service.layout import Layout, kernel_image, modules_dir
from service.verify.targetkernel.exports import Sources, load
from service.verify.targetkernel.exports_cache import CACHE_FORMAT

from .kernel import Kernel, cache_dir


def _build(release: str, cache: Path) -> bool:
    """Build the cache from the kernel's files where modstage finds them under / (the image
    in /boot, or in the module tree for 7.2), so that the key is the one the guest makes."""
    layout = Layout(Path("/"))
    sources = Sources(kernel_image(layout, release), modules_dir(layout, release), cache)
    table, _note = load(sources)
    return table.complete and cache.is_file()


def _current(path: Path, modules: Path) -> bool:
    """Whether the cache at ``path`` is of this modstage's format and newer than depmod's."""
    try:
        with path.open("rb") as f:
            head = f.read(len(CACHE_FORMAT))
        return (
            head == CACHE_FORMAT
            and path.stat().st_mtime > (modules / "modules.dep").stat().st_mtime
        )
    except OSError:
        return False


def built(kernel: Kernel) -> Path:
    """The cache file for ``kernel`` (built on first use, kept in the VM cache)."""
    root = cache_dir() / "exports"  # its cache/ must sit in an existing directory
    if kernel.own_root:  # per root: its key holds the time depmod ran when the root was built
        root = root / kernel.root.name
    root.mkdir(parents=True, exist_ok=True)
    path = root / "cache" / f"exports-{kernel.release}"
    if not kernel.own_root:
        ok = _build(kernel.release, path)
    elif _current(path, kernel.modules):
        return path
    else:
        ok = _build_in_root(kernel, path)
    if not ok:
        raise RuntimeError(f"cannot build the exports cache for {kernel.release} on the host")
    return path


# what load() imports when it runs: imported before a chroot, where the host's files are gone
PRELOAD = (
    "lzma",
    "zstandard",
    "stager.schema.atomic",
    "service.verify.compressed.decompress",
    "service.verify.modfile.modinfo",
    "service.verify.modfile.symtab",
    "service.verify.targetkernel.kimage",
    "service.layout",
)


def _build_in_root(kernel: Kernel, path: Path) -> bool:
    for name in PRELOAD:
        importlib.import_module(name)
    scratch = Path(tempfile.mkdtemp(prefix="exports-", dir=kernel.root / "tmp"))
    try:
        inside = Path("/tmp") / scratch.name / "cache" / f"exports-{kernel.release}"
        pid = os.fork()
        if pid == 0:  # the child: chroot, build, exit without running the parent's cleanups
            status = 1
            try:
                os.chroot(kernel.root)
                os.chdir("/")
                inside.parent.mkdir(parents=True)
                status = 0 if _build(kernel.release, inside) else 1
            finally:
                os._exit(status)
        _, status = os.waitpid(pid, 0)
        made = scratch / "cache" / f"exports-{kernel.release}"
        if status != 0 or not made.is_file():
            return False
        path.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(made, path)
        return True
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def seed(state_dir: Path, kernel: Kernel) -> None:
    """Give ``state_dir`` (a node's /var/lib/modstage) the exports cache of ``kernel``."""
    target = state_dir / "cache" / f"exports-{kernel.release}"
    if target.exists():
        return
    target.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    shutil.copyfile(built(kernel), target)
    target.chmod(0o600)

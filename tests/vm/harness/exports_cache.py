"""The target kernel's exports cache, built once on the host and given to every node.

Intake builds ``/var/lib/modstage/cache/exports-<release>`` from the kernel's own files on
its first run (service/verify/exports.py): about 2 s on real hardware, but one to three
minutes in a TCG guest reading 4,000 modules over 9p. The guest's root is the host's, so
the cache the host builds from the same files is the one the guest would build (it is
keyed by paths, sizes and modification times, which 9p passes through): each node's state
starts with a copy, as a node that has taken a drop in before would have it.
"""

from __future__ import annotations

import shutil
from pathlib import Path

from service.verify.exports import Sources, load

from .kernel import cache_dir


def built(release: str) -> Path:
    """The host's cache file for ``release`` (built on first use, kept in the VM cache)."""
    root = cache_dir() / "exports"  # its cache/ must sit in an existing directory
    root.mkdir(exist_ok=True)
    path = root / "cache" / f"exports-{release}"
    modules = Path("/lib/modules") / release
    table, _note = load(Sources(Path("/boot") / f"vmlinuz-{release}", modules, path))
    if not table.complete or not path.is_file():
        raise RuntimeError(f"cannot build the exports cache for {release} on the host")
    return path


def seed(state_dir: Path, release: str) -> None:
    """Give ``state_dir`` (a node's /var/lib/modstage) the host's exports cache."""
    target = state_dir / "cache" / f"exports-{release}"
    if target.exists():
        return
    target.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    shutil.copyfile(built(release), target)
    target.chmod(0o600)

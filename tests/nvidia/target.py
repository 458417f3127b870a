"""A host root whose target kernel is this machine's installed Debian kernel, whole.

``tests.kmod.install_target`` copies one in-tree module and ``Module.symvers``: enough for
the small test modules. The real NVIDIA modules import from ``drm`` and friends, so here
the target is what a real host has: ``boot/vmlinuz-<release>`` and the whole in-tree
module tree (linked, not copied), the configuration, ``modules.dep``, the built-in lists and
the headers' ``Module.symvers``. modstage reads its exports from these files exactly as it
does on a node (``service.verify.exports``).
"""

from __future__ import annotations

import shutil
from pathlib import Path

from tests.kmod.build import HEADERS

REAL_BOOT = Path("/boot")
REAL_MODULES = Path("/lib/modules")


def install_real_target(root: Path, release: str) -> Path:
    """Link ``release``'s image and in-tree modules under ``root``; copy its lists. ``root``."""
    modules = root / "lib/modules" / release
    (modules / "build").mkdir(parents=True, exist_ok=True)
    (modules / "kernel").symlink_to(REAL_MODULES / release / "kernel")
    for listing in ("modules.dep", "modules.builtin", "modules.builtin.modinfo", "modules.order"):
        shutil.copyfile(REAL_MODULES / release / listing, modules / listing)
    shutil.copyfile(
        HEADERS / f"linux-headers-{release}/Module.symvers", modules / "build/Module.symvers"
    )
    boot = root / "boot"
    boot.mkdir(parents=True, exist_ok=True)
    (boot / f"vmlinuz-{release}").symlink_to(REAL_BOOT / f"vmlinuz-{release}")
    shutil.copyfile(REAL_BOOT / f"config-{release}", boot / f"config-{release}")
    return root

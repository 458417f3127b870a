"""A host root whose target kernel is this machine's installed Debian kernel, whole.

``tests.kmod.install_target`` copies one in-tree module and ``Module.symvers``: enough for
the small test modules. The real NVIDIA modules import from ``drm`` and friends, so here
the target is what a real host has: ``boot/vmlinuz-<release>`` and the whole in-tree
module tree (linked, not copied), the configuration, ``modules.dep``, the built-in lists and
the headers' ``Module.symvers``. modstage reads its exports from these files exactly as it
does on a node (``service.verify.target.exports``).
"""

from __future__ import annotations

import shutil
from pathlib import Path


def install_real_target(root: Path, release: str, source: Path = Path("/")) -> Path:
    """Link ``release``'s image and in-tree modules under ``root``; copy its lists. The
    kernel's files are read under ``source``: this machine's for Debian 12's 6.1, the Debian
    13 test root for 6.12. Returns ``root``."""
    real_modules = source / "lib/modules" / release
    modules = root / "lib/modules" / release
    (modules / "build").mkdir(parents=True, exist_ok=True)
    (modules / "kernel").symlink_to(real_modules / "kernel")
    for listing in ("modules.dep", "modules.builtin", "modules.builtin.modinfo", "modules.order"):
        shutil.copyfile(real_modules / listing, modules / listing)
    headers = source / f"usr/src/linux-headers-{release}"
    shutil.copyfile(headers / "Module.symvers", modules / "build/Module.symvers")
    boot = root / "boot"
    boot.mkdir(parents=True, exist_ok=True)
    (boot / f"vmlinuz-{release}").symlink_to(source / f"boot/vmlinuz-{release}")
    shutil.copyfile(source / f"boot/config-{release}", boot / f"config-{release}")
    return root

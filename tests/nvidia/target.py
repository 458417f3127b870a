"""A host root whose target kernel is a real Debian kernel, whole: the builder's own.

``tests.kmod.install_target`` copies one in-tree module and ``Module.symvers``: enough for
the small test modules. The real NVIDIA modules import from ``drm`` and friends, so here
the target is what a real host has, laid out by the same code ``build-image`` verifies its
modules against (:meth:`buildimage.kernel.KernelFiles.install_target`): the kernel image and
in-tree module tree linked, the configuration, ``modules.dep``, the built-in lists and the
headers' ``Module.symvers`` copied. modstage reads its exports from these files exactly as
it does on a node (``service.verify.targetkernel.exports``).
"""

from __future__ import annotations

from pathlib import Path

from buildimage.kernel import KernelFiles


def install_real_target(root: Path, release: str, source: Path = Path("/")) -> Path:
    """Lay ``release``'s files under ``root``, read under ``source``: this machine's for
    Debian 12's 6.1, the Debian 13 test root for 6.12. Returns ``root``."""
    return KernelFiles(release, source).install_target(root)

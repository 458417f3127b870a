"""A target kernel's facts under a test root: one in-tree module, config, built-ins, CRCs.

``service.verify.targetkernel.Target.from_layout`` reads exactly these; the copies come from the
installed Debian kernel, so the vermagic and configuration are the real ones.
"""

from __future__ import annotations

import shutil
from pathlib import Path

IN_TREE = "kernel/lib/crc8.ko"  # small, Debian-signed, no dependencies


def install_target(
    root: Path, release: str, *, config_extra: str = "", source: Path = Path("/")
) -> Path:
    """Populate ``root`` with ``release``'s in-tree module, config and built-in list, read from
    the system under ``source`` (this machine's, or the Debian 13 test root for 6.12).

    ``config_extra`` lines are appended to the real configuration (later lines win in
    the parser), e.g. ``"CONFIG_CRYPTO_ECDSA=y\\n"``. Returns ``root``.
    """
    real = source / "lib/modules" / release
    modules = root / "lib/modules" / release
    (modules / IN_TREE).parent.mkdir(parents=True, exist_ok=True)
    in_tree = IN_TREE if (real / IN_TREE).exists() else IN_TREE + ".xz"  # 6.12's are .ko.xz
    shutil.copyfile(real / in_tree, modules / in_tree)
    for listing in ("modules.builtin", "modules.builtin.modinfo"):
        shutil.copyfile(real / listing, modules / listing)
    # build/ is an absolute link to the headers: read them under `source`
    (modules / "build").mkdir(exist_ok=True)
    headers = source / f"usr/src/linux-headers-{release}"
    shutil.copyfile(headers / "Module.symvers", modules / "build/Module.symvers")
    (root / "boot").mkdir(parents=True, exist_ok=True)
    config = (source / f"boot/config-{release}").read_text()
    (root / "boot" / f"config-{release}").write_text(config + config_extra)
    return root

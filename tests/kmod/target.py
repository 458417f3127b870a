"""A target kernel's facts under a test root: one in-tree module, config, built-ins, CRCs.

``service.verify.target.Target.from_layout`` reads exactly these; the copies come from the
installed Debian kernel, so the vermagic and configuration are the real ones.
"""

from __future__ import annotations

import shutil
from pathlib import Path

IN_TREE = "kernel/lib/crc8.ko"  # small, Debian-signed, no dependencies


def install_target(root: Path, release: str, *, config_extra: str = "") -> Path:
    """Populate ``root`` with ``release``'s in-tree module, config and built-in list.

    ``config_extra`` lines are appended to the real configuration (later lines win in
    the parser), e.g. ``"CONFIG_CRYPTO_ECDSA=y\\n"``. Returns ``root``.
    """
    real = Path("/lib/modules") / release
    modules = root / "lib/modules" / release
    (modules / IN_TREE).parent.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(real / IN_TREE, modules / IN_TREE)
    for listing in ("modules.builtin", "modules.builtin.modinfo", "build/Module.symvers"):
        (modules / listing).parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(real / listing, modules / listing)
    (root / "boot").mkdir(parents=True, exist_ok=True)
    config = Path(f"/boot/config-{release}").read_text()
    (root / "boot" / f"config-{release}").write_text(config + config_extra)
    return root

"""The two ways to the driver image agree: the Containerfile's environment is build-image's,
except the single kernel it is built for (build-image's images leave the kernel to
nvidia-driver, which takes the node's)."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

from buildimage.image import Contents, environment

CONTAINERFILE = Path(__file__).resolve().parents[2] / "deploy/driver-container/Containerfile"


def _containerfile_env() -> dict[str, str]:
    text = CONTAINERFILE.read_text().replace("\\\n", " ")
    [body] = re.findall(r"^ENV (.*)$", text, re.M)
    return dict(word.split("=", 1) for word in shlex.split(body))


def test_the_containerfile_sets_build_images_environment_but_the_kernel() -> None:
    """Every setting of build-image's environment but the per-kernel module root has the
    same value in the Containerfile, which adds only KERNEL_VERSION."""
    built = environment(Contents("1.0", [], Path("fw"), None, Path("base.tar")))
    theirs = _containerfile_env()
    assert set(theirs) - set(built) == {"KERNEL_VERSION"}
    for name, value in built.items():
        if name == "DRIVER_VERSION":
            assert theirs[name] == "${DRIVER_VERSION}"
        elif name != "MODSTAGE_MODULES_ROOT":
            assert theirs[name] == value, name

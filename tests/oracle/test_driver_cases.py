"""The helpers that make the real NVIDIA driver's oracle cases (tests/oracle/driver.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.nvidia.build import MODULE_NAMES, Driver
from tests.oracle.driver import _other_release, in_tree_dependencies, module_name


@pytest.mark.parametrize(
    ("release", "other"),
    [(b"6.1.0-57-amd64", b"6.1.0-58-amd64"), (b"6.12.117+deb13-amd64", b"6.12.117+deb14-amd64")],
)
def test_other_release_changes_only_the_release_in_vermagic(release: bytes, other: bytes) -> None:
    """The vermagic names another release of the same length; the flags after it and the
    rest of the file are unchanged, so the loader's vermagic check alone can refuse it."""
    payload = b"\0license=GPL\0vermagic=" + release + b" SMP preempt mod_unload modversions \0x"
    changed = _other_release(payload)
    assert len(changed) == len(payload)
    assert changed == payload.replace(release, other)


def test_in_tree_dependencies_leave_out_the_drivers_own_modules(tmp_path: Path) -> None:
    """The `depends=` of every module, less the driver's own (named as the kernel names
    them, with underscores), sorted; a module without dependencies adds none."""
    depends = {
        "nvidia": b"drm",
        "nvidia-modeset": b"video,nvidia",
        "nvidia-uvm": b"nvidia",
        "nvidia-drm": b"drm,drm_kms_helper,nvidia-modeset,drm_ttm_helper",
        "nvidia-peermem": b"",
    }
    modules = {}
    for name in MODULE_NAMES:
        path = tmp_path / f"{name}.ko"
        path.write_bytes(
            b"\x7fELF\0name=" + module_name(name).encode() + b"\0depends=" + depends[name] + b"\0"
        )
        modules[name] = path
    driver = Driver("proprietary", "550.163.01", "6.12.117+deb13-amd64", modules, tmp_path, {})
    assert in_tree_dependencies(driver) == ["drm", "drm_kms_helper", "drm_ttm_helper", "video"]
    assert module_name("nvidia-modeset") == "nvidia_modeset"

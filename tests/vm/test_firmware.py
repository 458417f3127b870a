"""Kernel truth: request_firmware finds a file only on the configured firmware search path."""

from __future__ import annotations

import errno
from pathlib import Path

import pytest

from tests.vm.harness import Vm

pytestmark = [pytest.mark.vm, pytest.mark.kernels("6.1", "6.12", "7.2")]

FIRMWARE_PATH = "/sys/module/firmware_class/parameters/path"
FW_SIZE = "/sys/module/ms_firmware/parameters/fw_size"


def test_firmware_is_found_only_after_the_path_points_at_it(
    vm: Vm, signed_modules: dict[str, Path]
) -> None:
    """ms_firmware reports -ENOENT while firmware_class.path is empty, the file's size after.

    The firmware lives on the state share (`<dir>/modstage/test.bin`), outside /lib/firmware;
    the kernel looks there only once `<dir>` is written to firmware_class's `path` parameter.
    """
    blob = bytes(range(256)) * 12 + b"modstage"
    firmware = vm.state_dir / "firmware" / "modstage" / "test.bin"
    firmware.parent.mkdir(parents=True)
    firmware.write_bytes(blob)
    module = vm.put(signed_modules["ms_firmware"], "kmod/ms_firmware.ko")
    assert vm.read(FIRMWARE_PATH) == ""
    try:
        assert vm.eval(f"finit_module({module!r})") == 0
        assert int(vm.read(FW_SIZE)) == -errno.ENOENT
        assert vm.eval("delete_module('ms_firmware')") == 0

        vm.eval(f"write({FIRMWARE_PATH!r}, {vm.guest_path(firmware.parents[1])!r})")
        assert vm.eval(f"finit_module({module!r})") == 0
        assert int(vm.read(FW_SIZE)) == len(blob)
    finally:
        vm.eval(f"write({FIRMWARE_PATH!r}, '')")
        vm.eval("delete_module('ms_firmware')")

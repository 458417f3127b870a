"""Kernel truth: request_firmware finds a file only on the configured firmware search path,
which it searches before /lib/firmware; intake refuses a drop that would shadow the node's."""

from __future__ import annotations

import errno
from pathlib import Path

import pytest

from tests.kmod import make_key
from tests.vm.harness import Vm, kmod
from tests.vm.harness.kernel import Kernel
from tests.vm.node import drop, modstage, prepare, state

pytestmark = [pytest.mark.vm, pytest.mark.kernels("6.1", "6.12", "7.2")]

FIRMWARE_PATH = "/sys/module/firmware_class/parameters/path"
FW_SIZE = "/sys/module/ms_firmware/parameters/fw_size"
# an empty write never reaches the parameter; a lone NUL clears it (service.host.firmware)
CLEAR = "\0"


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
        vm.eval(f"write({FIRMWARE_PATH!r}, {CLEAR!r})")
        vm.eval("delete_module('ms_firmware')")


def test_a_drop_shadowing_the_hosts_firmware_is_refused_at_intake(
    vm: Vm, kernel: Kernel, test_modules: dict[str, Path], tmp_path: Path
) -> None:
    """The hole, then its refusal. The kernel's loader searches firmware_class.path before
    /lib/firmware: with the node's own `/lib/firmware/modstage/test.bin`, ms_firmware loads
    that file while the path is empty and the path's file of the same name once the path is
    set. So intake refuses a drop whose declared `firmware/modstage/test.bin` the node's
    /lib/firmware also provides, naming the node's file and the rule, and records nothing
    pending; with `[bundles.fwshadow] firmware_override` naming it, the same drop is taken in.
    """
    key = make_key(tmp_path / "key", cn="firmware test key")
    module = kmod.sign(kernel, test_modules["ms_firmware"], key, tmp_path / "ms_firmware.ko")
    ours, theirs = b"host firmware " * 10, b"drop firmware " * 30
    shadow = vm.state_dir / "fwshadow" / "modstage" / "test.bin"
    shadow.parent.mkdir(parents=True)
    shadow.write_bytes(theirs)
    loaded = vm.put(module, "kmod/ms_firmware_shadow.ko")
    vm.python(
        "import os; os.makedirs('/lib/firmware/modstage', exist_ok=True); "
        f"open('/lib/firmware/modstage/test.bin', 'wb').write({ours!r})"
    )
    vm.eval(f"write({FIRMWARE_PATH!r}, {CLEAR!r})")
    assert vm.read(FIRMWARE_PATH) == ""
    try:
        assert vm.eval(f"finit_module({loaded!r})") == 0
        assert int(vm.read(FW_SIZE)) == len(ours)
        assert vm.eval("delete_module('ms_firmware')") == 0
        vm.eval(f"write({FIRMWARE_PATH!r}, {vm.guest_path(shadow.parents[1])!r})")
        assert vm.eval(f"finit_module({loaded!r})") == 0
        assert int(vm.read(FW_SIZE)) == len(theirs), "the path's file replaces /lib/firmware's"
        vm.eval(f"write({FIRMWARE_PATH!r}, {CLEAR!r})")
        assert vm.eval("delete_module('ms_firmware')") == 0

        certs = {"firmware-test.pem": key.cert_pem.read_bytes()}
        drop(
            vm, "fwshadow", "1", kernel.release, [(module, "")], firmware_dirs=(shadow.parents[1],)
        )
        prepare(vm, certs)
        rc, out = modstage(vm, "intake")
        assert rc == 1, out
        assert (
            "rejected: firmware/modstage/test.bin: the host provides "
            "/lib/firmware/modstage/test.bin; [bundles.fwshadow] firmware_override does not "
            "name it"
        ) in out, out
        assert state(vm).bundle("fwshadow").pending is None

        drop(
            vm, "fwshadow", "2", kernel.release, [(module, "")], firmware_dirs=(shadow.parents[1],)
        )
        prepare(vm, certs, '[bundles.fwshadow]\nfirmware_override = ["modstage/test.bin"]\n')
        rc, out = modstage(vm, "intake")
        assert rc == 0, out
        assert state(vm).bundle("fwshadow").pending
    finally:
        vm.eval(f"write({FIRMWARE_PATH!r}, {CLEAR!r})")
        vm.eval("delete_module('ms_firmware')")
        vm.python("import pathlib; pathlib.Path('/lib/firmware/modstage/test.bin').unlink()")
        modstage(vm, "forget", "fwshadow")
        prepare(vm, {})
        vm.python(
            "import pathlib; pathlib.Path('/etc/modstage/trusted.d/firmware-test.pem')"
            ".unlink(missing_ok=True)"
        )

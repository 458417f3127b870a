"""Kernel truth: with `module.sig_enforce=1` only modules signed by a trusted key load.

Debian's kernel trusts only its own ephemeral build key, so a module signed with the run's test
key is as unacceptable as an unsigned one; a Debian module whose bytes were changed after signing
fails its digest check. All three are refused with EKEYREJECTED, and nothing taints the kernel.
On both kernels; Debian 13 ships its modules as `.ko.xz` signed with an ECDSA P-384 key: the
tampered copy is decompressed first, the intact one is handed to the kernel compressed
(MODULE_INIT_COMPRESSED_FILE; 6.12 has MODULE_DECOMPRESS and ECDSA built in).
"""

from __future__ import annotations

import errno
import lzma
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.vm.harness import Vm, VmFactory
from tests.vm.harness.kernel import Kernel

pytestmark = [pytest.mark.vm, pytest.mark.kernels("6.1", "6.12", "7.2")]
MODULE_INIT_COMPRESSED_FILE = 4

DEBIAN_MODULE = "crc-itu-t"  # signed by Debian, no dependencies, loads anywhere
TAINT_UNSIGNED_MODULE = 1 << 13


@pytest.fixture(scope="module")
def enforcing(boot_vm: VmFactory) -> Iterator[Vm]:
    """A node booted with module.sig_enforce=1."""
    vm = boot_vm("enforcing", kernel_args=["module.sig_enforce=1"])
    yield vm
    vm.close()


def finit(vm: Vm, module: Path) -> int:
    """Put `module` on the state share and finit_module it; 0 or the errno."""
    return int(vm.eval(f"finit_module({vm.put(module, f'kmod/{module.name}')!r})"))


def test_enforcement_is_on(enforcing: Vm) -> None:
    """The kernel reports signature enforcement as enabled."""
    assert enforcing.read("/sys/module/module/parameters/sig_enforce") == "Y"


def test_module_signed_with_unknown_key_is_rejected(
    enforcing: Vm, signed_modules: dict[str, Path]
) -> None:
    """A module signed with a key outside the kernel's keyrings is refused: EKEYREJECTED."""
    assert finit(enforcing, signed_modules["ms_params"]) == errno.EKEYREJECTED
    assert not enforcing.eval("os.path.exists('/sys/module/ms_params')")


def test_unsigned_module_is_rejected(enforcing: Vm, test_modules: dict[str, Path]) -> None:
    """An unsigned module is refused: EKEYREJECTED."""
    assert finit(enforcing, test_modules["ms_exporter"]) == errno.EKEYREJECTED


def _debian_module(kernel: Kernel) -> Path:
    return kernel.modules / kernel.in_tree(DEBIAN_MODULE)


def test_tampered_debian_module_is_rejected(enforcing: Vm, tmp_path: Path, kernel: Kernel) -> None:
    """A Debian-signed module with one byte changed inside the signed region: EKEYREJECTED."""
    source = _debian_module(kernel)
    raw = source.read_bytes()
    data = bytearray(lzma.decompress(raw) if source.suffix == ".xz" else raw)
    data[len(data) // 3] ^= 0x01
    tampered = tmp_path / "crc-itu-t-tampered.ko"
    tampered.write_bytes(bytes(data))
    assert finit(enforcing, tampered) == errno.EKEYREJECTED
    assert not enforcing.eval("os.path.exists('/sys/module/crc_itu_t')")


def test_debian_signed_module_loads(enforcing: Vm, kernel: Kernel) -> None:
    """The same Debian module, unchanged, loads under enforcement and taints nothing (on
    6.12: the `.ko.xz` as shipped, decompressed by the kernel)."""
    source = _debian_module(kernel)
    path = f"/lib/modules/{kernel.release}/{kernel.in_tree(DEBIAN_MODULE)}"
    if source.suffix == ".xz":
        call = f"finit_module({path!r}, '', {MODULE_INIT_COMPRESSED_FILE})"
    else:
        call = f"finit_module({path!r})"
    assert enforcing.eval(call) == 0
    assert enforcing.eval("os.path.isdir('/sys/module/crc_itu_t')")
    assert not int(enforcing.read("/proc/sys/kernel/tainted")) & TAINT_UNSIGNED_MODULE

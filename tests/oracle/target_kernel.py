"""The kernel the oracle works for: the one its modules are built against and signed for, whose
files make modstage's target root, and that the guest boots.

Debian 12's 6.1 (the host's own kernel) unless `use()` picked another, as
tests/vm/test_oracle.py does per kernel of `MODSTAGE_KERNELS`. One kernel at a time: the
generator, the signer and the judge all read `active()`.
"""

from __future__ import annotations

from pathlib import Path

from tests.vm.harness.kernel import Kernel

_active: list[Kernel] = []


def active() -> Kernel:
    """The kernel picked by `use()`, else the host's (Debian 12's 6.1)."""
    if not _active:
        _active.append(Kernel.find())
    return _active[0]


def use(kernel: Kernel) -> None:
    """Make `kernel` the one the oracle builds, signs and judges for."""
    _active[:] = [kernel]


def headers(kernel: Kernel) -> Path:
    """The kernel's `-amd64` headers directory (Module.symvers, kbuild's entry point)."""
    return kernel.root / f"usr/src/linux-headers-{kernel.release}"

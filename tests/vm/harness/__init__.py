"""A QEMU test bed for modstage: Debian's signed kernel, the host's root, a state share.

See `Vm` (vm.py) for the API and tests/vm/README.md for running it by hand.
"""

from .errors import (
    CommandTimeout,
    GuestError,
    VmBootError,
    VmError,
    VmExited,
    VmSetupError,
    VmTimeout,
)
from .qemu import GUEST_STATE_DIR, parse_size
from .vm import Result, Vm, VmFactory

__all__ = [
    "GUEST_STATE_DIR",
    "CommandTimeout",
    "GuestError",
    "Result",
    "Vm",
    "VmBootError",
    "VmError",
    "VmExited",
    "VmFactory",
    "VmSetupError",
    "VmTimeout",
    "parse_size",
]

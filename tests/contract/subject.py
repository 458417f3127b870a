"""The small interface the contract drives, answered with errnos so it can run in the guest.

:class:`KernelSubject` wraps a :class:`~service.host.modules.Kernel` and a
:class:`~service.host.sysfs.Sysfs`: the fakes in-process, or ``LinuxKernel`` and
``/sys`` inside the test VM (where the host drives it through the guest agent). Every
answer is plain data (0 or an errno, dicts of strings) so it crosses the agent's JSON.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Protocol

from service.errors import LoadError
from service.host.firmware import PATH_PARAM, FirmwareView
from service.host.memory import MEMORY, blocks
from service.host.modules import Kernel
from service.host.sysfs import Sysfs


class Subject(Protocol):
    """What the contract cases call; :class:`KernelSubject` and the VM's proxy implement it."""

    def load(self, path: str, params: str = "") -> int:
        """finit_module the file at ``path``: 0 or the errno."""

    def load_image(self, path: str, name: str, params: str = "") -> int:
        """Load the bytes of ``path`` from a memfd called ``name``: 0 or the errno."""

    def unload(self, name: str) -> int:
        """delete_module(name, O_NONBLOCK): 0 or the errno."""

    def loaded(self) -> dict[str, str | None]:
        """Live modules: name -> srcversion."""

    def modprobe(self, names: list[str]) -> int:
        """modprobe -a NAMES: 0 or the errno."""

    def blocks(self) -> dict[int, str]:
        """Every memory block and its state."""

    def write(self, attribute: str, value: str) -> int:
        """Write a sysfs attribute (only if it differs): 0 or the errno."""

    def read(self, attribute: str) -> str:
        """A sysfs attribute without its trailing newline."""

    def entries(self, directory: str) -> list[str]:
        """The names in a sysfs directory, sorted; none when it is absent."""

    def point_firmware(self, view: str, wanted: bool) -> int:
        """FirmwareView.point(wanted) for a view at ``view``: 0 or 1 if refused."""


class KernelSubject:
    """A :class:`Subject` over a kernel and its sysfs."""

    def __init__(self, kernel: Kernel, sysfs: Sysfs) -> None:
        self.kernel = kernel
        self.sysfs = sysfs

    def load(self, path: str, params: str = "") -> int:
        """finit_module the file at ``path``: 0 or the errno."""
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
        try:
            self.kernel.load(fd, params)
        except LoadError as exc:
            return exc.errno
        finally:
            os.close(fd)
        return 0

    def load_image(self, path: str, name: str, params: str = "") -> int:
        """Load the bytes of ``path`` from a memfd called ``name``: 0 or the errno."""
        try:
            self.kernel.load_image(Path(path).read_bytes(), name, params)
        except LoadError as exc:
            return exc.errno
        return 0

    def unload(self, name: str) -> int:
        """delete_module(name, O_NONBLOCK): 0 or the errno."""
        try:
            self.kernel.unload(name)
        except LoadError as exc:
            return exc.errno
        return 0

    def loaded(self) -> dict[str, str | None]:
        """Live modules: name -> srcversion."""
        return self.kernel.loaded()

    def modprobe(self, names: list[str]) -> int:
        """modprobe -a NAMES: 0 or the errno."""
        try:
            self.kernel.modprobe(names)
        except LoadError as exc:
            return exc.errno
        return 0

    def blocks(self) -> dict[int, str]:
        """Every memory block and its state."""
        return blocks(self.sysfs)

    def write(self, attribute: str, value: str) -> int:
        """Write a sysfs attribute (only if it differs): 0 or the errno."""
        try:
            self.sysfs.write(attribute, value)
        except OSError as exc:
            return exc.errno or -1
        return 0

    def read(self, attribute: str) -> str:
        """A sysfs attribute without its trailing newline."""
        return self.sysfs.read(attribute)

    def entries(self, directory: str) -> list[str]:
        """The names in a sysfs directory, sorted; none when it is absent."""
        return self.sysfs.entries(directory)

    def point_firmware(self, view: str, wanted: bool) -> int:
        """FirmwareView.point(wanted) for a view at ``view``: 0 or 1 if refused."""
        from service.errors import BootError

        try:
            FirmwareView(Path(view), self.sysfs, allow_foreign=False).point(wanted)
        except BootError:
            return 1
        return 0


def state_of(block: int) -> str:
    """The sysfs attribute of a memory block's state."""
    return f"{MEMORY}/memory{block}/state"


def zones_of(block: int) -> str:
    """The sysfs attribute naming a memory block's zone(s)."""
    return f"{MEMORY}/memory{block}/valid_zones"


FIRMWARE_PATH = PATH_PARAM
AUTO_ONLINE = f"{MEMORY}/auto_online_blocks"

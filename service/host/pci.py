"""The PCI devices present on the node, and which of them a bundle's modules are for.

A module says which devices it drives in its ``.modinfo``: one ``alias=pci:v...d...sv...sd...
bc...sc...i...`` pattern per entry of its ``pci_device_id`` table (``scripts/mod/file2alias.c``
writes ``*`` for a wildcard field). Each device says what it is in
``/sys/bus/pci/devices/<address>/modalias`` and which driver has it in the ``driver`` link,
whose ``module`` link names the module that registered the driver. modprobe matches the two
with ``fnmatch(pattern, modalias, 0)`` (libkmod's alias index and configuration lookups);
:func:`alias_matches` is that match.

sysfs is read here directly, under the :class:`Sysfs` root, because this view must work under
``--root`` (a sandbox boot, ``modstage status --root``) and on the temporary sysfs trees the
tests build: libudev, and so pyudev, always reads the real ``/sys``. (pyudev's
``Device.properties['MODALIAS']`` and ``Device.driver`` come from the same sysfs files, not
from udev's database.) The daemon hears of devices added, bound and unbound through pyudev
(:mod:`service.daemon.uevents`) and then reads this view again.
"""

from __future__ import annotations

import ctypes
import os
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from service.host.sysfs import Sysfs

DEVICES = "bus/pci/devices"


@dataclass(frozen=True)
class PciDevice:
    """One PCI function as sysfs shows it."""

    address: str  # domain:bus:device.function, e.g. 0000:00:04.0
    modalias: str  # pci:v...d...sv...sd...bc..sc..i..
    driver: str | None = None  # the bound driver's name, None when unbound
    module: str | None = None  # the module that registered that driver (None: built in)

    @property
    def ids(self) -> str:
        """``vendor:device`` in lspci's form (``1234:11e8``), from the modalias."""
        m = re.match(r"pci:v0000([0-9A-F]{4})d0000([0-9A-F]{4})", self.modalias)
        return f"{m[1]}:{m[2]}".lower() if m else "?"


def present(sysfs: Sysfs) -> tuple[PciDevice, ...]:
    """Every PCI device under ``bus/pci/devices``, with its driver (address order).

    A device that disappears while it is read (hot removal) is left out.
    """
    found = []
    for address in sysfs.entries(DEVICES):
        base = f"{DEVICES}/{address}"
        try:
            modalias = sysfs.read(f"{base}/modalias")
        except OSError:
            continue
        driver = _link_name(sysfs, f"{base}/driver")
        module = _link_name(sysfs, f"{base}/driver/module") if driver else None
        found.append(PciDevice(address, modalias, driver, module))
    return tuple(found)


def _link_name(sysfs: Sysfs, link: str) -> str | None:
    """The last component of a sysfs link's target, None when the link is absent."""
    try:
        return os.path.basename(os.readlink(sysfs.root / link))
    except OSError:
        return None


def alias_matches(pattern: str, modalias: str) -> bool:
    """Whether ``modalias`` matches ``pattern``: glibc's ``fnmatch(pattern, modalias, 0)``,
    the call libkmod makes for every alias (``*`` also matches ``/``, ``\\`` quotes)."""
    return bool(_fnmatch(pattern.encode(), modalias.encode(), 0) == 0)


_libc = ctypes.CDLL(None)  # the process's glibc, as service.host.modules loads it
_fnmatch = _libc.fnmatch
_fnmatch.argtypes = [ctypes.c_char_p, ctypes.c_char_p, ctypes.c_int]
_fnmatch.restype = ctypes.c_int


@dataclass(frozen=True)
class Devices:
    """The present devices a bundle's modules are for, and who drives each."""

    devices: tuple[PciDevice, ...]  # present devices some module of the bundle matches
    modules: frozenset[str]  # the bundle's module names (normalized)

    @property
    def bound(self) -> tuple[PciDevice, ...]:
        """The devices a module of the bundle drives."""
        return tuple(d for d in self.devices if d.module in self.modules)

    @property
    def others(self) -> tuple[PciDevice, ...]:
        """The devices bound to a driver of another module (or a built-in one)."""
        return tuple(d for d in self.devices if d.driver and d.module not in self.modules)

    @property
    def free(self) -> tuple[PciDevice, ...]:
        """The devices no driver is bound to."""
        return tuple(d for d in self.devices if not d.driver)

    def summary(self) -> str:
        """``"2 of 2 devices bound"``, with each device not bound to the bundle named."""
        if not self.devices:
            return "no device present"
        n = len(self.devices)
        line = f"{len(self.bound)} of {n} device{'s' if n != 1 else ''} bound"
        away = [f"{d.address} ({d.ids}) bound to {d.driver}" for d in self.others]
        away += [f"{d.address} ({d.ids}) bound to nothing" for d in self.free]
        return f"{line}; {', '.join(away)}" if away else line


def devices_for(
    aliases: Mapping[str, Iterable[str]],
    present_devices: Iterable[PciDevice],
    modules: Iterable[str] = (),
) -> Devices:
    """The devices that any module's aliases (``{module: patterns}``) match; a device is
    the bundle's when its driver's module is one of ``aliases`` or ``modules``."""
    patterns = [p for ps in aliases.values() for p in ps]
    mine = tuple(d for d in present_devices if any(alias_matches(p, d.modalias) for p in patterns))
    return Devices(mine, frozenset(aliases) | frozenset(modules))

"""The PCI devices present on the node, and which of them a bundle's modules are for.

A module says which devices it drives in its ``.modinfo``: one ``alias=pci:v...d...sv...sd...
bc...sc...i...`` pattern per entry of its ``pci_device_id`` table (``scripts/mod/file2alias.c``
writes ``*`` for a wildcard field). Each device says what it is in
``/sys/bus/pci/devices/<address>/modalias`` and which driver has it in the ``driver`` link,
whose ``module`` link names the module that registered the driver. modprobe matches the two
with ``fnmatch(pattern, modalias, 0)`` (libkmod's alias index and configuration lookups);
:func:`alias_matches` is that match.

sysfs is read directly, not through pyudev or the udev database: boot runs before udev has
processed the coldplug events (the database may be empty then), the database does not record
the driver a device is bound to (sysfs' ``driver`` link is what pyudev's ``Device.driver``
reads too), and importing pyudev costs the boot path time it need not spend.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from functools import lru_cache

from service.kernel.sysfs import Sysfs

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
    """Whether ``modalias`` matches ``pattern`` as ``fnmatch(pattern, modalias, 0)`` does.

    POSIX fnmatch without flags: ``*`` any string (``/`` included), ``?`` one character,
    ``[...]`` a bracket expression (``!`` or ``^`` negates, ``a-z`` ranges, a leading ``]``
    is literal, an unterminated ``[`` is literal), ``\\`` quotes the next character and a
    trailing one matches nothing.
    """
    return _compiled(pattern).fullmatch(modalias) is not None


@lru_cache(maxsize=4096)
def _compiled(pattern: str) -> re.Pattern[str]:
    out, i, n = [], 0, len(pattern)
    while i < n:
        c = pattern[i]
        i += 1
        if c == "*":
            out.append(".*")
        elif c == "?":
            out.append(".")
        elif c == "\\":  # a trailing backslash matches nothing (glibc)
            out.append(re.escape(pattern[i]) if i < n else _NOTHING)
            i += 1
        elif c == "[":
            bracket, i = _bracket(pattern, i)
            out.append(bracket)
        else:
            out.append(re.escape(c))
    return re.compile("".join(out), re.DOTALL)


def _bracket(pattern: str, i: int) -> tuple[str, int]:
    """The regex of the bracket expression starting after ``[`` at ``i``, and where it ends;
    a literal ``[`` when the expression is not closed, and nothing-matches when the
    pattern ends inside a range or after a backslash in it (glibc's FNM_NOMATCH)."""
    n, j = len(pattern), i
    negate = j < n and pattern[j] in "!^"
    j += negate
    items: list[str] = []
    first = True
    while j < n and (pattern[j] != "]" or first):
        first = False
        c, quoted = pattern[j], False
        if c == "\\":
            if j + 1 >= n:
                return _NOTHING, n
            c, j, quoted = pattern[j + 1], j + 1, True
        if j + 1 < n and pattern[j + 1] == "-" and (j + 2 >= n or pattern[j + 2] != "]"):
            if j + 2 >= n:  # glibc: unterminated after a range's dash is no match...
                if c == "[" and not quoted:  # ...except after a '[' (read as a class opener)
                    return re.escape("["), i
                return _NOTHING, n
            hi, j = pattern[j + 2], j + 2
            if hi == "\\":
                if j + 1 >= n:
                    return _NOTHING, n
                hi, j = pattern[j + 1], j + 1
            items.append(f"{re.escape(c)}-{re.escape(hi)}" if c <= hi else "")
            j += 1
        else:
            items.append(re.escape(c))
            j += 1
    if j >= n:
        return re.escape("["), i
    body = "".join(items)
    if not body:  # an empty range matches nothing (negated: any character)
        return ("." if negate else _NOTHING), j + 1
    return f"[{'^' if negate else ''}{body}]", j + 1


_NOTHING = "(?!)"


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

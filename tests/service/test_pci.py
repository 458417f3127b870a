"""The PCI device view: alias matching as modprobe's fnmatch, sysfs read from a temporary tree."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from service.host.pci import PciDevice, alias_matches, devices_for, present
from service.host.sysfs import Sysfs

EDU = "pci:v00001234d000011E8sv00001AF4sd00001100bc00scFFi00"
GPU = "pci:v000010DEd00002330sv000010DEsd000016C1bc03sc02i00"

# What glibc's fnmatch(pattern, string, 0) decides (the call libkmod makes), in the cases
# where another matcher would decide otherwise: with FNM_PATHNAME '*' and '?' stop at '/',
# with FNM_NOESCAPE '\\' is a literal, with FNM_PERIOD a leading '.' must be literal, with
# FNM_CASEFOLD case is ignored; Python's fnmatch has no backslash quoting and turns an
# unclosed '[' into a literal but a trailing backslash into a literal too.
GLIBC = [
    ("pci:v*d*", "pci:v0000/d1", True),  # '*' crosses '/' (no FNM_PATHNAME)
    ("a?b", "a/b", True),
    ("*", ".hidden", True),  # no FNM_PERIOD
    ("pci:v0000ABCD*", "pci:v0000abcd", False),  # no FNM_CASEFOLD
    ("a\\*", "a*", True),  # backslash quotes (no FNM_NOESCAPE)
    ("a\\*", "ab", False),
    ("a\\", "a\\", False),  # a trailing backslash matches nothing
    ("[", "[", True),  # an unclosed bracket is a literal
    ("[!a]", "b", True),
    ("[^a]", "a", False),
    ("[]a]", "]", True),  # a leading ']' is a member
    ("[a-", "[a-", False),  # ends inside a range: nothing
    ("[z-a]", "m", False),  # an empty range
]


@pytest.mark.parametrize(("pattern", "string", "expected"), GLIBC)
def test_alias_matching_is_glibc_fnmatch_without_flags(
    pattern: str, string: str, expected: bool
) -> None:
    """alias_matches decides as glibc's fnmatch(pattern, string, 0) does where a flag or
    another implementation would decide otherwise ('/', '.', case, backslashes, brackets)."""
    assert alias_matches(pattern, string) is expected


def test_the_real_drivers_aliases_match_their_devices() -> None:
    """The NVIDIA driver's class-wildcard alias matches a 3D controller of vendor 10de and
    nothing of another vendor; a file2alias vendor:device alias matches only that device."""
    nvidia = "pci:v000010DEd*sv*sd*bc03sc02i00*"
    assert alias_matches(nvidia, GPU)
    assert not alias_matches(nvidia, GPU.replace("v000010DE", "v00001002", 1))
    assert not alias_matches(nvidia, GPU.replace("bc03sc02", "bc03sc00"))
    edu = "pci:v00001234d000011E8sv*sd*bc*sc*i*"
    assert alias_matches(edu, EDU) and not alias_matches(edu, EDU.replace("11E8", "11E9"))


def _device(sys: Path, address: str, modalias: str, driver: str | None, module: str | None) -> None:
    """A PCI device as sysfs lays it out: the device under devices/, the bus link, the
    driver directory under bus/pci/drivers with its module link."""
    real = sys / "devices/pci0000:00" / address
    real.mkdir(parents=True)
    (real / "modalias").write_text(modalias + "\n")
    bus = sys / "bus/pci/devices"
    bus.mkdir(parents=True, exist_ok=True)
    os.symlink(os.path.relpath(real, bus), bus / address)
    if driver is not None:
        drv = sys / "bus/pci/drivers" / driver
        drv.mkdir(parents=True, exist_ok=True)
        if module is not None and not (drv / "module").exists():
            (sys / "module" / module).mkdir(parents=True, exist_ok=True)
            os.symlink(os.path.relpath(sys / "module" / module, drv), drv / "module")
        os.symlink(os.path.relpath(drv, real), real / "driver")


def test_present_reads_each_device_its_driver_and_the_drivers_module(tmp_path: Path) -> None:
    """Each device's modalias, the driver its ``driver`` link names and the module that
    driver's ``module`` link names (none for a built-in driver or an unbound device)."""
    _device(tmp_path, "0000:00:04.0", EDU, "ms_pci", "ms_pci")
    _device(tmp_path, "0000:00:05.0", GPU, None, None)
    _device(tmp_path, "0000:00:01.1", "pci:v00008086d00007010sv*", "ata_piix", None)
    assert present(Sysfs(tmp_path)) == (
        PciDevice("0000:00:01.1", "pci:v00008086d00007010sv*", "ata_piix", None),
        PciDevice("0000:00:04.0", EDU, "ms_pci", "ms_pci"),
        PciDevice("0000:00:05.0", GPU, None, None),
    )
    assert present(Sysfs(tmp_path / "absent")) == ()


def test_devices_for_counts_bound_and_names_who_has_the_others() -> None:
    """Only devices an alias matches count; a device is the bundle's when its driver's
    module is one of the bundle's; the summary names each other device and its driver."""
    devices = [
        PciDevice("0000:41:00.0", GPU, "nvidia", "nvidia"),
        PciDevice("0000:42:00.0", GPU, "vfio-pci", "vfio_pci"),
        PciDevice("0000:43:00.0", GPU, None, None),
        PciDevice("0000:00:04.0", EDU, "ms_pci", "ms_pci"),
    ]
    mine = devices_for({"nvidia": ["pci:v000010DEd*sv*sd*bc03sc02i00*"]}, devices, ["nvidia_drm"])
    assert [d.address for d in mine.devices] == ["0000:41:00.0", "0000:42:00.0", "0000:43:00.0"]
    assert [d.address for d in mine.bound] == ["0000:41:00.0"]
    assert mine.summary() == (
        "1 of 3 devices bound; 0000:42:00.0 (10de:2330) bound to vfio-pci, "
        "0000:43:00.0 (10de:2330) bound to nothing"
    )
    assert devices_for({"x": ["pci:v0000FFFF*"]}, devices).summary() == "no device present"
    all_bound = devices_for({"ms_pci": ["pci:v00001234d000011E8sv*sd*bc*sc*i*"]}, devices)
    assert all_bound.summary() == "1 of 1 device bound"

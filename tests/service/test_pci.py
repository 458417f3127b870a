"""The PCI device view: alias matching as modprobe's fnmatch, sysfs read from a temporary tree."""

from __future__ import annotations

import ctypes
import ctypes.util
import os
from pathlib import Path

from hypothesis import given, settings
from hypothesis import strategies as st

from service.kernel.pci import PciDevice, alias_matches, devices_for, present
from service.kernel.sysfs import Sysfs

_libc = ctypes.CDLL(ctypes.util.find_library("c"))
_libc.fnmatch.argtypes = [ctypes.c_char_p, ctypes.c_char_p, ctypes.c_int]


def libc_fnmatch(pattern: str, string: str) -> bool:
    """glibc's ``fnmatch(pattern, string, 0) == 0``: what libkmod calls for aliases."""
    return bool(_libc.fnmatch(pattern.encode(), string.encode(), 0) == 0)


# modalias characters, every fnmatch metacharacter, and a few that make ranges interesting
# (character classes such as [:alpha:] are left out: file2alias never writes them)
ALPHABET = "pci:v0123ABFdsbi*?[]!^-\\"
CHAR = st.sampled_from(ALPHABET)
ITEM = st.one_of(
    CHAR.map(lambda c: "\\" + c),
    st.sampled_from("pci:v0123ABFdsbi*?!^-"),
    st.tuples(CHAR, CHAR).map(lambda r: f"{r[0]}-{r[1]}" if "\\" not in r else "x"),
)
# closed bracket expressions: an optional negation, a leading ']' or not, 1-3 items
BRACKET = st.tuples(
    st.sampled_from(["", "!", "^"]),
    st.sampled_from(["", "]"]),
    st.lists(ITEM, min_size=1, max_size=3),
).map(lambda t: f"[{t[0]}{t[1]}{''.join(t[2])}]")
TOKEN = st.one_of(st.sampled_from("pci:v0123ABFdsbi*?!^-]"), CHAR.map(lambda c: "\\" + c), BRACKET)
PATTERN = st.lists(TOKEN, max_size=6).map("".join)

EDU = "pci:v00001234d000011E8sv00001AF4sd00001100bc00scFFi00"
GPU = "pci:v000010DEd00002330sv000010DEsd000016C1bc03sc02i00"


@settings(max_examples=1000, deadline=None)
@given(PATTERN, st.text(ALPHABET, max_size=10), st.data())
def test_alias_matching_is_glibc_fnmatch_without_flags(
    pattern: str, string: str, data: st.DataObject
) -> None:
    """For any pattern of literals, quoted characters, ``*``, ``?`` and closed bracket
    expressions (negated, ranges, a leading ``]``, quoted members) over the modalias
    alphabet and every metacharacter, the match is glibc's fnmatch(pattern, string, 0)
    (called through ctypes), against a random string and against the pattern's own text."""
    for s in (string, pattern, data.draw(st.text(ALPHABET, max_size=10))):
        assert alias_matches(pattern, s) == libc_fnmatch(pattern, s), (pattern, s)


def test_unclosed_brackets_and_trailing_backslashes_are_matched_as_glibc_does() -> None:
    """Malformed patterns seen in the wild: an unclosed ``[`` is a literal, a pattern that
    ends in a backslash or inside a range matches nothing, as glibc's fnmatch decides."""
    for pattern in ("[", "[a", "a[", "[!", "[[", "[[-", "[-", "\\", "a\\", "[0-", "[a-", "[\\"):
        for s in (pattern, "a", "[a", "-"):
            assert alias_matches(pattern, s) == libc_fnmatch(pattern, s), (pattern, s)


@settings(max_examples=500, deadline=None)
@given(st.sampled_from([EDU, GPU]), st.data())
def test_alias_matching_agrees_on_real_modaliases(modalias: str, data: st.DataObject) -> None:
    """Patterns made from a real modalias with fields wildcarded or bracketed (as
    file2alias and hand-written aliases do) match exactly when glibc's fnmatch says so."""
    pattern = list(modalias)
    for i in data.draw(st.lists(st.integers(0, len(modalias) - 1), max_size=6)):
        pattern[i] = data.draw(st.sampled_from(["*", "?", "[0-9]", "[!A]", "[A-F]", "x"]))
    text = "".join(pattern)
    assert alias_matches(text, modalias) == libc_fnmatch(text, modalias)


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

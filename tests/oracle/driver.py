"""The real NVIDIA driver in the oracle's corpus: Debian's own build of it, judged by both.

Each kernel gets the driver of its own Debian release (:data:`tests.nvidia.RELEASE_DRIVER`:
bookworm's 535 for 6.1, trixie's 550 for 6.12), built against that kernel's headers
(:mod:`tests.nvidia.build`) and signed here with the kernel's own ``sign-file``. Without a
GPU the real ``nvidia``'s init returns ENODEV ("NVRM: No NVIDIA GPU found."), after every
loader check passed: the guest sees the kernel's ``module_load`` event fire
(:func:`tests.oracle.guest.trace_module_loads`), and the judge counts that as the kernel
accepting the module. ``nvidia-modeset``, ``-uvm`` and ``-drm`` import from ``nvidia``, so
alone (as the corpus loads them, and as ``modstage verify`` judges a file) the kernel refuses
them with ENOENT; ``nvidia-peermem`` imports nothing from it, loads, and its init returns
EINVAL (Debian builds it without a peer-memory provider).

The cases (category ``nvidia``):

* ``nvidia/signed``: ``nvidia.ko`` as the build made it, signed (sha256), and ``nvidia/sha512``;
* ``nvidia/<module>-alone``: each other module as built, signed;
* ``nvidia/tampered``: signed, then one byte of its code changed: EKEYREJECTED;
* ``nvidia/unknown-signer``: signed by a key trusted nowhere: EKEYREJECTED;
* ``nvidia/unsigned``: as the build made it: refused under enforcement;
* ``nvidia/crc-mismatch``: one ``__versions`` CRC changed, then signed: EINVAL;
* ``nvidia/other-release``: its vermagic names another release of the same ABI, signed: the
  loader accepts it (with modversions ``same_magic`` compares only what follows the release;
  the CRCs decide);
* ``nvidia/other-flags``: its vermagic's flags differ (``mod_unload``), signed: ENOEXEC.
"""

from __future__ import annotations

import re
from pathlib import Path

from tests.nvidia import Driver
from tests.nvidia.build import MODULE_NAMES
from tests.oracle import elf
from tests.oracle.cases import Case
from tests.oracle.pki import Pki
from tests.oracle.testbed import sign_file

CATEGORY = "nvidia"


def module_name(file_stem: str) -> str:
    """The kernel's name of a module file (``nvidia-modeset`` -> ``nvidia_modeset``)."""
    return file_stem.replace("-", "_")


def in_tree_dependencies(driver: Driver) -> list[str]:
    """The in-tree modules the driver's modules depend on (their ``depends=``, names as the
    kernel writes them, with underscores), sorted."""
    own = {module_name(name) for name in MODULE_NAMES}
    found: set[str] = set()
    for path in driver.modules.values():
        match = re.search(rb"\0depends=([^\0]*)\0", path.read_bytes())
        found |= {module_name(d) for d in (match[1].decode().split(",") if match else []) if d}
    return sorted(found - own)


def _other_release(payload: bytes) -> bytes:
    """``payload`` built for a release one ABI number off (same length, NUL-padded)."""
    match = re.search(rb"vermagic=(\d+\.\d+\.\d+)([-+][^ \0]*) ", payload)
    assert match, "the driver has no vermagic"
    release = match[1] + match[2]
    abi = re.search(rb"[-+]\D*\d+", release)  # 6.1.0-57-amd64: 57; 6.12.117+deb13: 13
    assert abi, release
    last = abi.end() - 1
    bumped = str((release[last] - ord("0") + 1) % 10).encode()
    other = release[:last] + bumped + release[last + 1 :]
    assert len(other) == len(release) and other != release
    return payload.replace(b"vermagic=" + release + b" ", b"vermagic=" + other + b" ", 1)


def driver_cases(driver: Driver, pki: Pki, workdir: Path) -> list[Case]:
    """The real driver's cases (see the module docstring), in a fixed order."""
    workdir.mkdir(parents=True, exist_ok=True)
    signer = pki["rsa2048" if pki.ca.is_ec else "ca"]  # what the generated cases sign with
    raw = driver.modules["nvidia"].read_bytes()

    def signed(payload: bytes, hash: str = "sha256", cred: str = "") -> bytes:
        return sign_file(payload, pki[cred] if cred else signer, workdir / "sign.ko", hash)

    cases = [
        Case("nvidia/signed", CATEGORY, "nvidia", signed(raw), stem="nvidia-signed"),
        Case("nvidia/sha512", CATEGORY, "nvidia", signed(raw, "sha512"), stem="nvidia-sha512"),
    ]
    for name in MODULE_NAMES[1:]:
        data = signed(driver.modules[name].read_bytes())
        cases.append(Case(f"nvidia/{name}-alone", CATEGORY, module_name(name), data, stem=name))
    tampered = bytearray(signed(raw))
    text, size = elf.section_data(raw, ".text")
    tampered[text + size // 2] ^= 0x01
    variants = {
        "tampered": bytes(tampered),
        "unknown-signer": signed(raw, cred="stranger"),
        "unsigned": raw,
        "crc-mismatch": signed(elf.flip_version_crc(raw, None)),
        "other-release": signed(_other_release(raw)),
        "other-flags": signed(raw.replace(b" mod_unload ", b" mod_unlXad ", 1)),
    }
    for label, data in variants.items():
        cases.append(Case(f"nvidia/{label}", CATEGORY, "nvidia", data, stem=f"nvidia-{label}"))
    return cases

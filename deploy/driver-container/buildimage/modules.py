"""Each kernel's modules: built (or taken ready-built), stripped, signed and verified.

:func:`prepare` returns, for one kernel, a directory of signed modules in load order that
``modstage verify`` accepted against that kernel's own files and the signer's certificate,
with what it took (the build's seconds, cached or not; signing and verifying). It writes
under the build's scratch directory only: nothing of the image exists until every kernel's
modules are accepted.

The driver is either a Debian ``nvidia-kernel-source`` version (built once per kernel into
the cache, :func:`buildimage.nvidia.build_driver`) or a directory of modules already built
per kernel (``DIR/<release>/*.ko``, unsigned), stripped here as DKMS strips them.
"""

from __future__ import annotations

import hashlib
import shutil
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from buildimage import BuildError
from buildimage.kernel import KernelFiles
from buildimage.nvidia import MODULE_NAMES, build_driver
from buildimage.sign import Signer, sign, strip, verify


@dataclass(frozen=True)
class DriverSource:
    """Where the modules come from: a Debian package version, or ``prebuilt/<release>/``."""

    package_version: str | None = None  # e.g. 550.163.01-2
    prebuilt: Path | None = None
    flavor: str = "proprietary"

    def describe(self) -> str:
        """The source as the report says it."""
        if self.package_version is not None:
            package = (
                "nvidia-kernel-source"
                if self.flavor == "proprietary"
                else "nvidia-open-kernel-source"
            )
            return f"{package} {self.package_version}"
        return f"prebuilt {self.prebuilt}"


@dataclass(frozen=True)
class KernelModules:
    """One kernel's signed, accepted modules and the record of how they were made."""

    kernel: KernelFiles
    directory: Path  # <name>.ko each, signed
    names: tuple[str, ...]  # load order
    record: dict[str, Any]


def _depends(path: Path) -> set[str]:
    """The module names ``path`` imports symbols from (its ``.modinfo`` ``depends=``)."""
    done = subprocess.run(
        ["modinfo", "-F", "depends", str(path)], capture_output=True, text=True, check=False
    )
    if done.returncode != 0:
        raise BuildError(f"{path}: modinfo failed: {done.stderr.strip()}")
    return {_norm(n) for n in done.stdout.strip().split(",") if n}


def _norm(name: str) -> str:
    return name.replace("-", "_")


def load_order(found: dict[str, Path]) -> list[str]:
    """The names of ``found`` ordered so that each comes after the modules among them it
    depends on (NVIDIA's own order, then the name, between independent ones)."""
    deps = {name: _depends(path) & {_norm(n) for n in found} for name, path in found.items()}
    rank = {n: i for i, n in enumerate(MODULE_NAMES)}
    order: list[str] = []
    while len(order) < len(found):
        placed = {_norm(n) for n in order}
        ready = [n for n in found if n not in order and deps[n] <= placed]
        if not ready:
            cycle = sorted(n for n in found if n not in order)
            raise BuildError(f"modules depend on each other in a cycle: {', '.join(cycle)}")
        order.append(min(ready, key=lambda n: (rank.get(n, len(rank)), n)))
    return order


def _unsigned(
    source: DriverSource, kernel: KernelFiles, cache: Path
) -> tuple[dict[str, Path], dict[str, Any], bool]:
    """(name -> unsigned module, build record, whether strip is still due)."""
    if source.package_version is not None:
        driver = build_driver(cache, source.package_version, kernel, source.flavor)
        record = {
            "build_seconds": driver.build["seconds"],
            "cached": driver.cached,
            "load_after": driver.build["load_after"],
        }
        return dict(driver.modules), record, False
    assert source.prebuilt is not None
    directory = source.prebuilt / kernel.release
    found = (
        {p.name.removesuffix(".ko"): p for p in directory.glob("*.ko")}
        if directory.is_dir()
        else {}
    )
    if not found:
        raise BuildError(f"kernel {kernel.release}: no {directory}/*.ko (the ready-built modules)")
    return {n: found[n] for n in load_order(found)}, {"prebuilt": str(directory)}, True


def prepare(
    source: DriverSource, kernel: KernelFiles, signer: Signer, cache: Path, scratch: Path
) -> KernelModules:
    """``kernel``'s modules of ``source`` signed by ``signer`` and accepted by ``modstage
    verify``, in ``scratch/<release>``; :class:`~buildimage.sign.ModuleRefused` or
    :class:`BuildError` otherwise."""
    unsigned, record, strip_due = _unsigned(source, kernel, cache)
    directory = scratch / kernel.release
    directory.mkdir(parents=True)
    copies = []
    for name, path in unsigned.items():
        shutil.copyfile(path, directory / f"{name}.ko")
        copies.append(directory / f"{name}.ko")
    started = time.monotonic()
    if strip_due:
        strip(kernel, copies, scratch)
    sign(kernel, copies, signer, scratch)
    signed = time.monotonic()
    verdicts = verify(kernel, cache / f"verify-target-{kernel.release}", signer.cert, copies)
    done = time.monotonic()
    record.update(
        root=str(kernel.root),
        sign_seconds=round(signed - started, 1),
        verify_seconds=round(done - signed, 1),
        modules={
            Path(v["file"]).name: {
                "sha256": hashlib.sha256(Path(v["file"]).read_bytes()).hexdigest(),
                "bytes": Path(v["file"]).stat().st_size,
                "signer": v["signer"],
                "hash": v["hash"],
                "key_id": v["key_id"],
                "vermagic": v["vermagic"],
            }
            for v in verdicts
        },
    )
    return KernelModules(kernel, directory, tuple(unsigned), record)

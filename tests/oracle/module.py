"""The oracle's base module (kmod/msorc_00000.c), built once with kbuild and renamed per case.

Every case needs its own module name so that hundreds of variants load in one boot without
`EEXIST`. The name `msorc_00000` is rewritten in place (same length) everywhere it occurs,
which covers `.modinfo` `name=` and the name inside `.gnu.linkonce.this_module`.
"""

from __future__ import annotations

import hashlib
import shutil
import subprocess
from pathlib import Path

from tests.kmod.build import build_once, cache_root, kernel_release

SRC = Path(__file__).with_name("kmod")
BASE_NAME = b"msorc_00000"


def module_name(index: int) -> str:
    """The module name of case `index` (same length as the base name)."""
    return f"msorc_{index:05d}"


def _digest(release: str) -> str:
    h = hashlib.sha256(release.encode())
    for path in sorted(SRC.iterdir()):
        h.update(path.name.encode() + b"\0" + path.read_bytes())
    return h.hexdigest()[:16]


def _copy_sources(into: Path) -> None:
    for path in SRC.iterdir():
        shutil.copy2(path, into / path.name)


def _strip(work: Path) -> None:
    proc = subprocess.run(
        ["strip", "--strip-debug", str(work / "msorc_00000.ko")],
        capture_output=True,
        text=True,
        check=False,
    )
    if proc.returncode != 0:
        raise RuntimeError(f"strip failed ({proc.returncode}):\n{proc.stderr}")


def base_module() -> bytes:
    """The unsigned base module (debug info stripped), built and cached on first use."""
    release = kernel_release()
    final = cache_root() / f"oracle-module-{release}-{_digest(release)}"
    return (build_once(final, _copy_sources, finish=_strip) / "msorc_00000.ko").read_bytes()


def renamed(module: bytes, index: int) -> bytes:
    """`module` with its name replaced by `module_name(index)` everywhere."""
    if BASE_NAME not in module:
        raise ValueError("module does not carry the base name")
    return module.replace(BASE_NAME, module_name(index).encode())

"""The oracle's modules (kmod/), built once with kbuild and renamed per case.

The base module (`msorc_00000.c`) imports only what every module does; the symbols module
(`msors_00000.c`) imports a normal, a GPL-only, a namespaced and a weak vmlinux export.
Every case needs its own module name so that hundreds of variants load in one boot without
`EEXIST`. The built name (`msorc_00000` or `msors_00000`) is rewritten in place (same
length) everywhere it occurs, which covers `.modinfo` `name=` and the name inside
`.gnu.linkonce.this_module`.
"""

from __future__ import annotations

import hashlib
import shutil
import subprocess
from pathlib import Path

from tests.kmod.build import cache_root
from tests.oracle.target_kernel import active
from tests.vm.harness.kmod import build_tree

SRC = Path(__file__).with_name("kmod")
BASE_NAME = b"msorc_00000"
SYMBOLS_NAME = b"msors_00000"
BUILT_NAMES = (BASE_NAME, SYMBOLS_NAME)


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
        ["strip", "--strip-debug", *(str(work / f"{n.decode()}.ko") for n in BUILT_NAMES)],
        capture_output=True,
        text=True,
        check=False,
    )
    if proc.returncode != 0:
        raise RuntimeError(f"strip failed ({proc.returncode}):\n{proc.stderr}")


def _built(name: bytes) -> bytes:
    """The unsigned module `name` (debug info stripped) for the active kernel, built against
    its headers and cached on first use."""
    kernel = active()
    final = cache_root() / f"oracle-module-{kernel.release}-{_digest(kernel.release)}"
    tree = build_tree(kernel, final, _copy_sources, finish=_strip)
    return (tree / f"{name.decode()}.ko").read_bytes()


def base_module() -> bytes:
    """The unsigned base module: it imports only `module_layout`, `__fentry__` and
    `__x86_return_thunk` (normal exports)."""
    return _built(BASE_NAME)


def symbols_module() -> bytes:
    """The unsigned symbols module (see kmod/msors_00000.c for what it imports)."""
    return _built(SYMBOLS_NAME)


def renamed(module: bytes, index: int) -> bytes:
    """`module` with its built name replaced by `module_name(index)` everywhere."""
    for built in BUILT_NAMES:
        if built in module:
            return module.replace(built, module_name(index).encode())
    raise ValueError("module does not carry a built name")

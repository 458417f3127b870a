"""The oracle's base module (kmod/msorc_00000.c), built once with kbuild and renamed per case.

Every case needs its own module name so that hundreds of variants load in one boot without
`EEXIST`. The name `msorc_00000` is rewritten in place (same length) everywhere it occurs,
which covers `.modinfo` `name=` and the name inside `.gnu.linkonce.this_module`.
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import shutil
import subprocess
import tempfile
from pathlib import Path

from tests.kmod.build import HEADERS, cache_root, kernel_release

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


def _run(argv: list[str], **kwargs: object) -> None:
    proc = subprocess.run(argv, capture_output=True, text=True, check=False, **kwargs)  # type: ignore[call-overload]
    if proc.returncode != 0:
        raise RuntimeError(f"{argv[0]} failed ({proc.returncode}):\n{proc.stdout}\n{proc.stderr}")


def base_module() -> bytes:
    """The unsigned base module (debug info stripped), built and cached on first use."""
    release = kernel_release()
    final = cache_root() / f"oracle-module-{release}-{_digest(release)}.ko"
    if final.is_file():
        return final.read_bytes()
    with open(cache_root() / "build.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if final.is_file():
            return final.read_bytes()
        work = Path(tempfile.mkdtemp(prefix="oracle-", dir=cache_root()))
        try:
            for path in SRC.iterdir():
                shutil.copy2(path, work / path.name)
            env = {k: v for k, v in os.environ.items() if not k.startswith(("MAKE", "MFLAGS"))}
            make = ["make", "-C", str(HEADERS / f"linux-headers-{release}"), f"M={work}"]
            _run([*make, "modules"], env=env)
            ko = work / "msorc_00000.ko"
            _run(["strip", "--strip-debug", str(ko)])
            tmp = final.with_name(f".{final.name}.{os.getpid()}")
            shutil.copyfile(ko, tmp)
            os.replace(tmp, final)
        finally:
            shutil.rmtree(work, ignore_errors=True)
    return final.read_bytes()


def renamed(module: bytes, index: int) -> bytes:
    """`module` with its name replaced by `module_name(index)` everywhere."""
    if BASE_NAME not in module:
        raise ValueError("module does not carry the base name")
    return module.replace(BASE_NAME, module_name(index).encode())

"""Build the test modules in ``src/`` with kbuild against the installed Debian headers.

The build is cached on disk, keyed by the sources' digest and the kernel release, so a
test run pays for kbuild once per machine. Two pytest processes may call
:func:`build_modules` at once: a lock file serialises them and the finished build is
published by renaming its directory into place.
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import re
import shutil
import subprocess
import tempfile
from collections.abc import Callable
from pathlib import Path

SRC = Path(__file__).with_name("src")
HEADERS = Path("/usr/src")
MODULES = Path("/lib/modules")
MODULE_NAMES = (
    "ms_params",
    "ms_firmware",
    "ms_exporter",
    "ms_consumer",
    "ms_enodev",
    "ms_panic",
    "ms_pci",
    "ms_pci_rival",
)


def _version_key(release: str) -> list[int]:
    return [int(n) for n in re.findall(r"\d+", release)]


def kernel_release() -> str:
    """The installed Debian kernel release (``6.1.0-57-amd64``): headers and modules both present.

    ``$MODSTAGE_TEST_KERNEL`` overrides the choice; with several installed, the newest wins.
    """
    forced = os.environ.get("MODSTAGE_TEST_KERNEL")
    if forced:
        return forced
    releases = [
        p.name.removeprefix("linux-headers-")
        for p in HEADERS.glob("linux-headers-*-amd64")
        if (p / "Makefile").is_file()
    ]
    releases = [r for r in releases if (MODULES / r).is_dir()] or releases
    if not releases:
        raise RuntimeError(
            "no Debian kernel headers under /usr/src (install linux-headers-amd64 "
            "and linux-image-amd64)"
        )
    return max(releases, key=_version_key)


def cache_root() -> Path:
    """``$MODSTAGE_TEST_CACHE`` or ``~/.cache/modstage-test``, created on demand."""
    root = Path(os.environ.get("MODSTAGE_TEST_CACHE") or Path.home() / ".cache/modstage-test")
    root.mkdir(parents=True, exist_ok=True)
    return root


def _source_digest(release: str) -> str:
    h = hashlib.sha256(release.encode() + b"\0")
    for path in sorted(SRC.iterdir()):
        if path.is_file():
            h.update(path.name.encode() + b"\0" + path.read_bytes() + b"\0")
    return h.hexdigest()[:24]


def _built(directory: Path) -> dict[str, Path]:
    return {name: directory / f"{name}.ko" for name in MODULE_NAMES}


def kbuild(work: Path, release: str, *variables: str) -> None:
    """``make -C <headers> M=work VARIABLES modules`` against ``release``'s headers (the
    caller's own make environment left out); a failure raises with make's output."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("MAKE", "MFLAGS"))}
    headers = HEADERS / f"linux-headers-{release}"
    proc = subprocess.run(
        ["make", "-C", str(headers), f"M={work}", *variables, "modules"],
        env=env,
        capture_output=True,
        text=True,
        check=False,
    )
    if proc.returncode != 0:
        raise RuntimeError(f"kbuild failed ({proc.returncode}):\n{proc.stdout}\n{proc.stderr}")


def build_once(
    final: Path,
    fill: Callable[[Path], None],
    *variables: str,
    finish: Callable[[Path], None] | None = None,
) -> Path:
    """The directory ``final`` holding a kbuild tree built once per machine.

    ``fill(work)`` writes the sources (and their Kbuild) into a fresh directory of the
    cache; kbuild builds them with ``variables``; ``finish(work)`` may post-process; the
    directory is then renamed to ``final``. Processes building at once serialise on the
    cache's lock, and the rename publishes only a finished build.
    """
    if final.is_dir():
        return final
    with open(cache_root() / "build.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if final.is_dir():
            return final
        work = Path(tempfile.mkdtemp(prefix="build-", dir=cache_root()))
        try:
            fill(work)
            kbuild(work, kernel_release(), *variables)
            if finish is not None:
                finish(work)
            work.rename(final)
        finally:
            shutil.rmtree(work, ignore_errors=True)
    return final


def _copy_sources(into: Path) -> None:
    for path in SRC.iterdir():
        if path.is_file():
            shutil.copy2(path, into / path.name)


def build_modules() -> dict[str, Path]:
    """Module name -> path of the UNSIGNED ``.ko`` built against :func:`kernel_release`."""
    release = kernel_release()
    final = cache_root() / f"modules-{release}-{_source_digest(release)}"
    return _built(build_once(final, _copy_sources))


def padded_module(module: Path, out: Path, size: int) -> Path:
    """A copy of ``module`` grown to about ``size`` bytes by a non-allocated ``.ms_pad``
    section of random bytes (the kernel ignores such sections), for large-file tests."""
    pad = out.with_suffix(".pad")
    with pad.open("wb") as f:
        remaining = max(0, size - module.stat().st_size)
        while remaining:
            step = min(remaining, 1 << 20)
            f.write(os.urandom(step))
            remaining -= step
    proc = subprocess.run(
        ["objcopy", "--add-section", f".ms_pad={pad}", str(module), str(out)],
        capture_output=True,
        text=True,
        check=False,
    )
    pad.unlink()
    if proc.returncode != 0:
        raise RuntimeError(f"objcopy failed: {proc.stderr.strip()}")
    return out

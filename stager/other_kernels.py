"""``nvidia-driver init``'s drops for the host's other installed kernels.

A node may boot back into a kernel it has installed besides the running one and the next
(a fallback entry in grub, an admin's ``grub-reboot``). When the driver image carries
modules for such a kernel (``/opt/modstage/modules/<release>/``), ``init`` stages one drop
for it too, before the running kernel's (a bundle has one pending slot: the running
kernel's drop, staged last, keeps it; the host retains the newest generation of each
installed kernel and a boot into that kernel loads it, :func:`service.bundles.cover.carried`).
The host judges each against that kernel's own files; "pending for another kernel" is its
success. A refusal or a timeout is said in the pod's log and does not stop ``init``.

Which kernels: those the host announces as installed (``installed`` in ``_host.json``:
:mod:`service.publish.announce`), but the running one and the next boot's (that one is staged
while the pod sleeps, :meth:`stager.driver.Driver.next_kernel`). A kernel the image lacks is
named in the log. Idempotent: a kernel the host already has a generation of this image's
version for (the pod's status copy lists the bundle's ``generations``) is not staged again,
so a restarted pod stages nothing twice; one of them that failed is said, not restaged (the
host would refuse it: ``modstage retry`` brings it back).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Protocol

from stager.schema.statusfile import StatusFile
from stager.wait import EXIT_ACTIVE, EXIT_OTHER_KERNEL, Awaited, wait_for


class Image(Protocol):
    """What the driver image tells (:class:`stager.driver.Settings`)."""

    @property
    def version(self) -> str: ...
    @property
    def modstage_dir(self) -> Path: ...
    @property
    def host_file(self) -> Path: ...
    @property
    def host_wait(self) -> float: ...
    def modules_for(self, release: str) -> Path | None: ...
    def carried(self) -> list[str]: ...


class Driver(Protocol):
    """The pod's run (:class:`stager.driver.Driver`): its image, its log, staging, waiting."""

    @property
    def settings(self) -> Image: ...
    @property
    def wait_interval(self) -> float: ...
    @property
    def sleep(self) -> Callable[[float], None]: ...
    def say(self, message: str) -> None: ...
    def stage_for(self, kernel: str, module_dir: Path) -> Path: ...


def announced(driver: Driver) -> tuple[list[str], str | None]:
    """The installed kernels the host announces and its next kernel (none: nothing)."""
    try:
        doc = json.loads(driver.settings.host_file.read_bytes())
        installed = [k for k in doc.get("installed") or () if isinstance(k, str)]
        release = doc.get("next_kernel")
    except (OSError, ValueError, AttributeError, TypeError):
        return [], None  # an older host, or none yet: nothing announced
    return installed, release if isinstance(release, str) else None


def has_version(status: StatusFile | None, version: str) -> dict[str, str | None]:
    """Per kernel, the host's generation of ``version`` built for it: its failure, or None
    (it did not fail)."""
    out: dict[str, str | None] = {}
    for info in ((status.generations or {}) if status else {}).values():
        if info.version == version and out.get(info.kernel, "x") is not None:
            out[info.kernel] = info.failed
    return out


def stage_installed(driver: Driver, running: str) -> list[str]:
    """Stage this image's modules for each other installed kernel it carries and the host
    lacks (see the module's docstring); the drops staged."""
    s = driver.settings
    installed, release = announced(driver)
    others = [k for k in installed if k not in (running, release)]
    if not others:
        return []
    path = s.modstage_dir / "status" / "nvidia.json"
    status = StatusFile.read(path)
    if status is not None and status.generations is None:
        driver.say("the host lists no generations to this pod: no drop for other kernels")
        return []
    have = has_version(status, s.version)
    staged = []
    for kernel in others:
        if kernel in have:
            if (failed := have[kernel]) is not None:
                driver.say(f"nvidia {s.version} for installed kernel {kernel} failed: {failed}")
            continue
        module_dir = s.modules_for(kernel)
        if module_dir is None:
            driver.say(
                f"kernel {kernel} is installed on the host and this image carries no modules "
                f"for it (it carries: {', '.join(s.carried()) or 'none'}): a boot into it "
                f"runs without nvidia {s.version}"
            )
            continue
        staged.append(_stage_one(driver, kernel, module_dir))
    return staged


def _stage_one(driver: Driver, kernel: str, module_dir: Path) -> str:
    """Stage for one installed ``kernel`` and wait for the host's verdict; the drop's name."""
    from stager.schema.manifest import Manifest

    s = driver.settings
    drop = driver.stage_for(kernel, module_dir)
    generation = Manifest.read(drop).digest
    driver.say(f"kernel {kernel} is installed: staged {drop.name} for it; waiting for the host")
    path = s.modstage_dir / "status" / "nvidia.json"
    code = wait_for(
        lambda: StatusFile.read(path),
        Awaited.from_drop(drop, generation),
        driver.say,
        timeout=s.host_wait,
        interval=driver.wait_interval,
        sleep=driver.sleep,
    )
    if code not in (EXIT_OTHER_KERNEL, EXIT_ACTIVE):
        driver.say(f"the host did not take {drop.name} in for kernel {kernel}; init goes on")
    return drop.name

"""What the host tells a driver pod about its kernels: ``status/_host.json``.

A driver image may carry modules for several kernels (``/opt/modstage/modules/<release>/``).
For its pod to stage a driver for the kernel the next boot runs, before that reboot, it must
know which kernel that is and whether each bundle already has a generation for it; the pod
sees only the directories the host publishes to it. So beside the bundles' status files the
host writes one file of its own, ``_host.json`` (no bundle is named so: a bundle name starts
with a letter or digit):

* ``running_kernel``, ``next_kernel`` (None: ``next_kernel_unknown`` says why) and how it
  was decided (:mod:`service.host.nextboot`; ``next_kernel_fallback``: where grub falls
  back from what its default names), ``installed`` (the installed kernels' releases);
* ``bundles``: per bundle, ``next``: ``ready`` (a boot into the next kernel loads it),
  ``waiting`` (a drop for it arrived and is not judged yet), ``refused`` (the newest drop
  for it was refused), ``held`` (only a generation an admin holds is for it), ``none``
  (nothing is), in that precedence (:func:`~service.bundles.cover.next_kernel_cover`);
* ``written``: when (epoch seconds).

It is written with every status mirror (intake, boot, the admin's verbs), by the daemon's
periodic scan, and by its kernel watch within seconds of a kernel installed or removed
(:mod:`service.daemon.kernelwatch`); a file whose
contents would not change but for ``written`` is left as it is. A failure is logged, never
raised.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

from service.bundles.cover import would_load
from service.bundles.state import State
from service.config import Config
from service.host.installed import installed
from service.host.nextboot import NextKernel, next_kernel
from service.host.running import RunningHost
from service.layout import Layout
from service.logs import get_logger
from service.publish.arrivals import next_covers
from stager.schema.atomic import write_atomic

HOST_FILE = "_host.json"
SCHEMA = 1
log = get_logger("modstage.announce")


def host_doc(
    layout: Layout, state: State, found: NextKernel, config: Config | None = None
) -> dict[str, Any]:
    """The announcement from the host's files, ``state``, the next kernel ``found`` and
    ``config`` (the bundles' ``min_version``, the incoming directories; None: defaults)."""
    running = RunningHost.read(layout).release
    release = found.release
    return {
        "schema": SCHEMA,
        "running_kernel": running,
        "next_kernel": release,
        "next_kernel_how": found.how.value if release else None,
        "next_kernel_unknown": found.unknown,
        "next_kernel_fallback": found.fallback,
        "installed": [k.release for k in installed(layout)],
        "bundles": _covers(layout, config, state, release),
        "written": round(time.time(), 3),
    }


def _covers(
    layout: Layout, config: Config | None, state: State, release: str | None
) -> dict[str, dict[str, Any]]:
    """Each bundle's entry: ``next`` (:data:`~service.bundles.cover.COVERS`, or ``unknown``)
    and, when ready, the ``next_generation`` and ``next_version`` a boot into ``release``
    brings up."""
    if not release:
        return {name: {"next": "unknown"} for name in sorted(state.bundles)}
    config = config if config is not None else Config()
    covers = next_covers(layout, config, state, release)
    out: dict[str, dict[str, Any]] = {}
    for name, bundle in sorted(state.bundles.items()):
        entry: dict[str, Any] = {"next": covers[name]}
        floor = config.bundle_policy(name).min_version
        if (gen := would_load(bundle, release, floor, config.max_boot_attempts)) is not None:
            entry.update(next_generation=gen.id, next_version=gen.version)
        out[name] = entry
    return out


def announce(
    layout: Layout, config: Config, state: State, found: NextKernel | None = None
) -> list[Path]:
    """Write ``_host.json`` into the status directory and each ``[publish] status_dirs``;
    the files written (a failure is logged)."""
    found = found if found is not None else next_kernel(layout, config.kernel.next)
    doc = host_doc(layout, state, found, config)
    data = (json.dumps(doc, indent=2, sort_keys=True) + "\n").encode()
    written = []
    for directory in (layout.status, *(layout.host(d) for d in config.publish.status_dirs)):
        path = directory / HOST_FILE
        if _same(path, doc):
            continue  # unchanged but for its time: a scan every few seconds writes nothing
        try:
            directory.mkdir(parents=True, exist_ok=True)
            write_atomic(path, data, mode=0o644)
        except OSError as exc:
            log.error("host.announce_failed", path=str(path), error=str(exc))
            continue
        written.append(path)
    return written


def _same(path: Path, doc: dict[str, Any]) -> bool:
    """Whether ``path`` holds ``doc`` already, ``written`` aside."""
    try:
        old = json.loads(path.read_bytes())
    except (OSError, ValueError):
        return False
    return isinstance(old, dict) and {**old, "written": None} == {**doc, "written": None}

"""The operator contract: drops from several incoming directories, and what a pod reads back.

The NVIDIA GPU operator's driver pod mounts only ``/run/nvidia`` (and a few single files)
of the host. So a host may take drops from more than one incoming directory
(``incoming_dirs``), publish copies of each bundle's status where such a pod can read
them (``[publish] status_dirs``), and, once a bundle's generation is live, write the
config digest its drop carried (``DRIVER_CONFIG_DIGEST``) to a file the admin fixed
(``[publish] digest_files``, e.g. ``/run/nvidia/nvidia-driver.state``). The operator's
init container (``k8s-driver-manager uninstall_driver``) keeps a loaded driver only when
that file holds the digest it was given; ``/run`` is a tmpfs, so ``modstage boot``
writes it again on every boot. The container names no path here: a drop only carries
the digest's value, in the file :data:`stager.schema.paths.DIGEST_NAME`.
"""

from __future__ import annotations

import contextlib
import os
import re
from dataclasses import replace
from pathlib import Path

from service.bundles.state import BundleState, State
from service.bundles.statefile import read
from service.config import Config
from service.dropfs import read_small
from service.errors import DropError, StateError
from service.host.nextboot import next_kernel
from service.host.running import RunningHost
from service.layout import Layout
from service.logs import get_logger
from service.publish.announce import announce
from service.publish.labels import write_labels
from stager.schema.atomic import write_atomic
from stager.schema.paths import BUNDLE_RE, DIGEST_NAME
from stager.schema.statusfile import GenerationInfo, StatusFile

log = get_logger("modstage.publish")
DIGEST_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._:+=/-]{0,255}\Z")
MAX_DIGEST_BYTES = 512


def incoming_dirs(layout: Layout, config: Config) -> list[Path]:
    """Every directory containers drop into, under the layout's root."""
    return [layout.host(p) for p in config.incoming_dirs]


def read_digest(drop_fd: int, display: Path) -> str | None:
    """The config digest a drop carries (None if it carries none); :class:`DropError` if bad."""
    try:
        raw = read_small(drop_fd, DIGEST_NAME, display=display, max_bytes=MAX_DIGEST_BYTES)
    except DropError as exc:
        if exc.reason == "does not exist":
            return None
        raise
    try:
        text = raw.decode("ascii").strip()
    except UnicodeDecodeError as exc:
        raise DropError(display / DIGEST_NAME, "is not ASCII") from exc
    if not DIGEST_RE.match(text):
        raise DropError(display / DIGEST_NAME, "is not a config digest (one printable word)")
    return text


def record_digest(layout: Layout, generation: str, digest: str | None) -> None:
    """Remember the digest a generation's latest drop carried (or forget it: None)."""
    path = layout.config_digests / generation
    if digest is None:
        with contextlib.suppress(FileNotFoundError):
            path.unlink()
        return
    layout.config_digests.mkdir(parents=True, exist_ok=True)
    write_atomic(path, digest.encode() + b"\n")


def recorded_digest(layout: Layout, generation: str) -> str | None:
    """The digest recorded for ``generation``, None if none was."""
    try:
        text = (layout.config_digests / generation).read_text(encoding="ascii").strip()
    except (FileNotFoundError, UnicodeDecodeError):
        return None
    return text if DIGEST_RE.match(text) else None


def forget_digests(layout: Layout, state: State) -> None:
    """Remove the digests of generations that state no longer names."""
    known = {g for b in state.bundles.values() for g in b.generations}
    with contextlib.suppress(FileNotFoundError):
        for entry in layout.config_digests.iterdir():
            if entry.name not in known:
                entry.unlink(missing_ok=True)


def publish_digest(layout: Layout, config: Config, name: str, bundle: BundleState) -> str | None:
    """Write bundle ``name``'s config digest to the admin's file once a generation of it
    is live; return the path (None when the config names no file for the bundle).

    The digest is :meth:`~service.bundles.state.BundleState.published_digest`'s: a refused
    drop's while one is recorded, else that of the generation
    :meth:`~service.bundles.state.BundleState.digest_generation` names. Without a digest
    the file is removed, so no stale digest claims a config.
    """
    target = config.publish.digest_file(name)
    if target is None:
        return None
    path = layout.host(target)
    recorded = {g: d for g in bundle.generations if (d := recorded_digest(layout, g))}
    digest = bundle.published_digest(recorded)
    of = "refused drop" if bundle.refused else bundle.digest_generation(recorded)
    if digest is None:
        with contextlib.suppress(FileNotFoundError):
            path.unlink()
        log.info("digest.cleared", bundle=name, path=str(path))
        return str(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    write_atomic(path, digest.encode())  # no newline: the init container compares exactly
    log.info("digest.published", bundle=name, path=str(path), digest=digest, of=of)
    return str(path)


def mirror_status(layout: Layout, config: Config, state: State | None = None) -> None:
    """Publish the state for the cluster: node labels, and a copy of every
    ``status/<bundle>.json`` in each ``status_dirs``, with what a pod needs.

    The labels go to node-feature-discovery's feature file (:mod:`service.publish.labels`).
    Each status copy adds ``generations`` (id -> version, kernel, failed) and
    ``running_kernel``, so a driver container can tell its own version's failure and a
    drop for another kernel. A failure is logged, never raised: publishing must not stop
    intake or boot. ``state`` is the state just saved, when the caller holds it (the boot);
    otherwise ``state.json`` is read.
    """
    if state is None:
        try:
            state = read(layout.state)
        except (OSError, ValueError, StateError) as exc:
            log.error("status.mirror_failed", error=str(exc))
            return
    found = next_kernel(layout, config.kernel.next)
    try:
        if written := write_labels(layout, config.node_labels, state, found.release, config):
            log.info("labels.written", path=str(written))
    except OSError as exc:
        log.error("labels.write_failed", error=str(exc))
    announce(layout, config, state, found)
    if not config.publish.status_dirs:
        return
    try:
        running = RunningHost.read(layout).release  # once for every copy
        docs = {p.stem: _enriched(p, state, running) for p in bundle_status_files(layout.status)}
    except (OSError, ValueError) as exc:
        log.error("status.mirror_failed", error=str(exc))
        return
    for directory in config.publish.status_dirs:
        target = layout.host(directory)
        try:
            target.mkdir(parents=True, exist_ok=True)
            for bundle, doc in sorted(docs.items()):
                write_atomic(target / f"{bundle}.json", doc.to_json())
        except OSError as exc:
            log.error("status.mirror_failed", directory=str(target), error=str(exc))


def bundle_status_files(directory: Path) -> list[Path]:
    """The bundles' status files in ``directory`` (``<bundle>.json``; not the host's own
    ``_host.json``)."""
    if not directory.is_dir():
        return []
    return sorted(p for p in directory.glob("*.json") if BUNDLE_RE.match(p.stem))


def _enriched(path: Path, state: State, running: str | None) -> StatusFile:
    doc = StatusFile.from_json(path.read_bytes(), path)
    b = state.bundles.get(path.stem)
    gens = b.generations.values() if b else ()
    return replace(
        doc,
        generations={g.id: GenerationInfo(g.version, g.kernel, g.failed) for g in gens},
        running_kernel=running or doc.running_kernel,
    )


def ensure_dirs(dirs: list[Path]) -> None:
    """Create the incoming directories (``/run`` is empty after every boot)."""
    for d in dirs:
        os.makedirs(d, mode=0o755, exist_ok=True)

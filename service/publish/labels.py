"""Each bundle's state as node labels, through node-feature-discovery's local feature file.

nfd-worker reads every regular file in ``/etc/kubernetes/node-feature-discovery/features.d``
(dot-files ignored, files over 64 KiB skipped) and turns each ``key=value`` line into a
node label, so a fleet's rollout shows in ``kubectl get nodes -L ...`` with no credential
on the host. Per bundle, under a prefix of modstage's own (``[node_labels] prefix``, never
one the GPU operator or NFD owns): ``<bundle>.phase``, ``<bundle>.active`` and
``<bundle>.pending`` (versions), when the generation last deployed failed at boot
``<bundle>.failed`` (a short reason, until a newer generation comes up), when a refused drop
brought the active generation back ``<bundle>.rejected`` (the drop's short reason, until a
drop is accepted), and while an admin holds it ``<bundle>.held``. For the host:
``kernel.next``, the kernel the next boot runs (as a label value: ``+`` becomes ``-``), and
when that is another kernel than the running one, per bundle ``<bundle>.next``: ``ready``,
``waiting``, ``refused``, ``held`` or ``none`` (:func:`~service.bundles.cover.next_kernel_cover`),
so a pre-staging job can select the nodes that still need a driver. Keys and values keep to
the Kubernetes label syntax; the file is rewritten whole through the one crash-safe write
(a dot-file, then a rename), so a removed bundle's labels go with the next write.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Mapping
from pathlib import Path

from service.bundles.cover import next_kernel_cover
from service.bundles.state import BundleState, State
from service.config import Config, NodeLabels
from service.host.running import RunningHost
from service.layout import Layout
from service.publish.arrivals import next_covers
from stager.schema.atomic import write_atomic

FILE_NAME = "modstage"
MAX_FILE_BYTES = 65_536  # nfd-worker skips larger files
MAX_NAME = 63  # a label key's name part, and a label value
_NOT_VALUE = re.compile(r"[^A-Za-z0-9._-]+")


def label_value(text: str) -> str:
    """``text`` as a valid label value: runs of other characters become ``-``, at most
    63 characters, alphanumeric at both ends (possibly empty)."""
    value = _NOT_VALUE.sub("-", text)[:MAX_NAME]
    return re.sub(r"^[^A-Za-z0-9]+|[^A-Za-z0-9]+$", "", value)


def _name(bundle: str, what: str) -> str:
    """``<bundle>.<what>``, the bundle shortened with a digest when the whole is too long."""
    name = f"{bundle}.{what}"
    if len(name) <= MAX_NAME:
        return name
    digest = hashlib.sha256(bundle.encode()).hexdigest()[:8]
    keep = MAX_NAME - len(what) - len(digest) - 2
    return f"{bundle[:keep].rstrip('-_')}-{digest}.{what}"


def bundle_labels(name: str, bundle: BundleState) -> dict[str, str]:
    """The labels of one bundle (names without the prefix); versions and reasons as values."""

    def version(gen: str | None) -> str:
        known = bundle.generations.get(gen) if gen else None
        return label_value(known.version) if known else ""

    out = {
        _name(name, "phase"): label_value(bundle.phase.value),
        _name(name, "active"): version(bundle.active),
        _name(name, "pending"): version(bundle.pending),
    }
    if failed := bundle.deployed_failure():  # until another new generation comes up
        out[_name(name, "failed")] = label_value(failed.failed or "") or "failed"
    if bundle.refused is not None:  # until a drop is accepted
        out[_name(name, "rejected")] = label_value(bundle.refused.reason) or "rejected"
    if bundle.held:
        out[_name(name, "held")] = "true"
    return out


def render(
    state: State,
    prefix: str,
    next_kernel: str | None = None,
    running: str | None = None,
    covers: Mapping[str, str] | None = None,
) -> bytes:
    """The feature file: one ``prefix/name=value`` a line, bundles by name, at most
    :data:`MAX_FILE_BYTES` (bundles that do not fit are left out and said to be);
    ``next_kernel``: the kernel the next boot runs (None: unknown), ``running`` the running
    one, ``covers`` each bundle's cover for it (:func:`~service.publish.arrivals.next_covers`;
    None or a bundle it lacks: from its state alone)."""
    head = b"# written by modstage: each bundle's phase and versions (do not edit)\n"
    lines = [head]
    if next_kernel is not None:
        lines.append(f"{prefix}/kernel.next={label_value(next_kernel)}\n".encode())
    size = sum(len(line) for line in lines)
    update = next_kernel is not None and next_kernel != running
    for name, bundle in sorted(state.bundles.items()):
        labels = bundle_labels(name, bundle)
        if update and next_kernel is not None:
            cover = (covers or {}).get(name) or next_kernel_cover(bundle, next_kernel)
            labels[_name(name, "next")] = cover
        chunk = "".join(f"{prefix}/{k}={v}\n" for k, v in labels.items())
        if size + len(chunk) + 64 > MAX_FILE_BYTES:
            lines.append(f"{prefix}/labels.truncated=true\n".encode())
            break
        lines.append(chunk.encode())
        size += len(chunk)
    return b"".join(lines)


#: node-feature-discovery's directory of local feature files (both units may write it:
#: ReadWritePaths= in deploy/systemd/, checked by tests/test_units.py)
FEATURES_DIR = "/etc/kubernetes/node-feature-discovery/features.d"


def features_file(layout: Layout) -> Path:
    """modstage's file in node-feature-discovery's ``features.d`` (under ``--root``)."""
    return layout.host(FEATURES_DIR) / FILE_NAME


def write_labels(
    layout: Layout,
    labels: NodeLabels,
    state: State,
    next_kernel: str | None = None,
    config: Config | None = None,
) -> Path | None:
    """Rewrite the feature file from ``state`` (and the next boot's kernel) when enabled and
    ``features.d`` exists; unchanged contents are not written again. Returns the file
    written, else None. The covers take the bundles' ``min_version`` and incoming
    directories from ``config`` (None: ``config.toml`` as boot reads it, defaults for what
    is invalid)."""
    path = features_file(layout)
    if not labels.enabled or not path.parent.is_dir():
        return None
    running = RunningHost.read(layout).release
    covers = None
    if next_kernel is not None and next_kernel != running:
        config = config if config is not None else Config.salvage(layout.config)[0]
        covers = next_covers(layout, config, state, next_kernel)
    data = render(state, labels.prefix, next_kernel, running, covers)
    try:
        if path.read_bytes() == data:
            return None
    except OSError:
        pass
    write_atomic(path, data, mode=0o644)
    return path

"""The drops that arrived and are not judged yet, by the kernel they are built for.

A drop sits in an incoming directory from the moment its manifest appears until intake
took it in or refused it: while it is being taken in, and while it waits there (its bundle
held by an admin, an admin's rollback pending, its target kernel's module tree not
installed yet: :mod:`service.intake.scan`). The next kernel's cover says ``waiting`` for a
bundle with such a drop for that kernel (:func:`service.bundles.cover.next_kernel_cover`;
:func:`next_covers` gives every bundle's, as the announcement, the labels and the gate
report them).

Only what intake would look at counts: a directory named as a drop, with its manifest,
not recorded as left in place (:func:`service.publish.quarantine.left_in_place`). The
manifest is read as intake reads it (no symlink followed, its size bounded); a manifest
that cannot be read or parsed names no kernel (intake refuses it). At most
:data:`MAX_READ` manifests are read per call.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping
from pathlib import Path

from service.bundles.cover import next_kernel_cover
from service.bundles.state import State
from service.config import Config, Limits
from service.dropfs import manifest_kernel
from service.layout import Layout
from service.publish import quarantine
from stager.schema.paths import MANIFEST_NAME, parse_drop_name

MAX_READ = 64  # manifests read per call: a flood of drops costs a scan no more than this


def arrivals(layout: Layout, config: Config) -> dict[str, frozenset[str]]:
    """Per bundle, the kernels its drops in ``config.incoming_dirs`` are built for."""
    dirs = [layout.host(p) for p in config.incoming_dirs]
    found: dict[str, set[str]] = {}
    for bundle, kernel in _kernels(layout, _drops(dirs), config.limits):
        found.setdefault(bundle, set()).add(kernel)
    return {b: frozenset(k) for b, k in found.items()}


def _drops(dirs: Iterable[Path]) -> list[Path]:
    """The complete drops in ``dirs``, newest name first within each directory."""
    out: list[Path] = []
    for directory in dirs:
        try:
            names = sorted(os.listdir(directory), reverse=True)
        except OSError:
            continue
        for name in names:
            drop = directory / name
            if parse_drop_name(name) is not None and os.path.lexists(drop / MANIFEST_NAME):
                out.append(drop)
    return out


def _kernels(layout: Layout, drops: list[Path], limits: Limits) -> Iterable[tuple[str, str]]:
    """(bundle, kernel) of each drop whose manifest reads, at most :data:`MAX_READ`."""
    for drop in drops[:MAX_READ]:
        if quarantine.left_in_place(layout, drop):
            continue
        named = parse_drop_name(drop.name)
        if named is not None and (kernel := manifest_kernel(drop, limits)) is not None:
            yield named[0], kernel


def arrived(found: Mapping[str, frozenset[str]], bundle: str, release: str) -> bool:
    """Whether ``found`` (:func:`arrivals`) has a drop of ``bundle`` for ``release``."""
    return release in found.get(bundle, frozenset())


def next_covers(layout: Layout, config: Config, state: State, release: str) -> dict[str, str]:
    """Each bundle's cover for a boot into ``release`` (:func:`next_kernel_cover`), with
    its ``min_version``, the drops that arrived for it and the quarantine's records of
    those refused."""
    found = arrivals(layout, config)
    refusals = quarantine.records(layout)
    return {
        name: next_kernel_cover(
            bundle,
            release,
            floor=config.bundle_policy(name).min_version,
            arrived=arrived(found, name, release),
            refused_at=quarantine.refused_at(refusals, name, release),
            max_attempts=config.max_boot_attempts,
        )
        for name, bundle in sorted(state.bundles.items())
    }

"""Which kernels are installed under a root, and which of them is newest, as Debian orders them.

A kernel is installed when ``/boot/vmlinuz-<release>`` or its module tree
(``/lib/modules/<release>``, ``/usr/lib/modules/<release>``) exists; each is listed with
whether it has an image (what a boot loader can start) and a module tree (what modstage
verifies against). Releases are ordered by :func:`compare_versions`, dpkg's algorithm
(``dpkg --compare-versions``; lib/dpkg/version.c ``verrevcmp``), never by string order:
``6.12.95+deb12-amd64`` is newer than ``6.1.0-50-amd64``, ``6.1.0-50`` than ``6.1.0-9``.

Nothing here raises on an odd tree: an unreadable directory lists nothing, and at most
:data:`MAX_ENTRIES` names of each directory are looked at.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from service.host.running import RunningHost
from service.layout import Layout, is_release, kernel_image, modules_dir

MAX_ENTRIES = 4096  # names read from each of /boot and the module directories
_IMAGE = "vmlinuz-"


def _order(c: str) -> int:
    """dpkg's weight of one non-digit character: '~' first, then the end, letters, others."""
    if c == "~":
        return -1
    if c.isdigit():
        return 0
    if c.isascii() and c.isalpha():
        return ord(c)
    return ord(c) + 256


def _verrevcmp(a: str, b: str) -> int:
    """dpkg's ``verrevcmp``: alternate non-digit runs (by :func:`_order`) and digit runs
    (numerically) until one string differs."""
    i = j = 0
    while i < len(a) or j < len(b):
        first_diff = 0
        while (i < len(a) and not a[i].isdigit()) or (j < len(b) and not b[j].isdigit()):
            ac = _order(a[i]) if i < len(a) else 0
            bc = _order(b[j]) if j < len(b) else 0
            if ac != bc:
                return ac - bc
            i, j = i + 1, j + 1
        while i < len(a) and a[i] == "0":
            i += 1
        while j < len(b) and b[j] == "0":
            j += 1
        while i < len(a) and a[i].isdigit() and j < len(b) and b[j].isdigit():
            if not first_diff:
                first_diff = ord(a[i]) - ord(b[j])
            i, j = i + 1, j + 1
        if i < len(a) and a[i].isdigit():
            return 1
        if j < len(b) and b[j].isdigit():
            return -1
        if first_diff:
            return first_diff
    return 0


def _split(version: str) -> tuple[int, str, str]:
    """(epoch, upstream, revision) as dpkg splits a version: epoch before the first ':' when
    it is a number, revision after the last '-'."""
    epoch, colon, rest = version.partition(":")
    if not colon or not epoch.isdigit():
        epoch, rest = "0", version
    upstream, dash, revision = rest.rpartition("-")
    return (int(epoch), upstream, revision) if dash else (int(epoch), rest, "")


def compare_versions(a: str, b: str) -> int:
    """Negative, zero or positive as ``a`` sorts before, with or after ``b`` by
    ``dpkg --compare-versions``."""
    ea, ua, ra = _split(a)
    eb, ub, rb = _split(b)
    if ea != eb:
        return ea - eb
    return _verrevcmp(ua, ub) or _verrevcmp(ra, rb)


def newest(releases: Iterable[str]) -> str | None:
    """The release that sorts last by :func:`compare_versions` (None: there is none)."""
    ordered = sorted(releases, key=functools.cmp_to_key(compare_versions))
    return ordered[-1] if ordered else None


@dataclass(frozen=True)
class InstalledKernel:
    """One installed kernel: its release, its image and its module tree (None: absent)."""

    release: str
    image: str | None  # /boot/vmlinuz-<release>, else vmlinuz in its module tree
    modules: str | None  # /lib/modules/<release> or /usr/lib/modules/<release>


def _names(directory: Path) -> list[str]:
    """Up to :data:`MAX_ENTRIES` names in ``directory`` (none when it cannot be read)."""
    names: list[str] = []
    try:
        with os.scandir(directory) as entries:
            for entry in entries:
                if len(names) >= MAX_ENTRIES:
                    break
                names.append(entry.name)
    except OSError:
        return []
    return names


def installed(layout: Layout) -> tuple[InstalledKernel, ...]:
    """Every kernel installed under ``layout``'s root, newest first."""
    found = {n.removeprefix(_IMAGE) for n in _names(layout.boot) if n.startswith(_IMAGE)}
    for tree in layout.module_trees():
        found |= set(_names(tree))
    kernels = []
    for release in sorted(r for r in found if is_release(r)):
        image, modules = kernel_image(layout, release), modules_dir(layout, release)
        kernels.append(
            InstalledKernel(
                release,
                str(image) if image.is_file() else None,
                str(modules) if modules.is_dir() else None,
            )
        )
    kernels = [k for k in kernels if k.image or k.modules]  # e.g. a dangling link
    kernels.sort(key=functools.cmp_to_key(lambda x, y: compare_versions(y.release, x.release)))
    return tuple(kernels)


def installed_releases(layout: Layout) -> frozenset[str]:
    """The installed kernels' releases (:func:`installed`), the running one always among
    them; empty when the boot directory and module trees cannot be read."""
    try:
        found = {k.release for k in installed(layout)}
    except OSError:
        found = set()
    running = RunningHost.read(layout).release
    if running is not None:
        found.add(running)
    return frozenset(found)

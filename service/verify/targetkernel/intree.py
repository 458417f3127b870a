"""The target kernel's own modules, by name: what a drop's module would take the place of.

The kernel registers a module under its name once per boot; a drop's module loaded early
by ``modstage boot`` under the name of one of the kernel's own modules takes that name, and
modprobe of the kernel's module later finds it loaded. The target's module tree
(``lib/modules/<release>``, as :func:`service.layout.modules_dir` finds it) names
its own modules in two places, both read: every ``*.ko*`` file under ``kernel/``, and each
``kernel/`` line of ``modules.dep``. That file also lists ``updates/``, ``extra/`` and
other out-of-tree modules an admin or DKMS installed: those are not the kernel's own and
are not counted. The modules built into the image are ``modules.builtin``'s, which
:class:`~service.verify.targetkernel.kernel.Target` reads (``builtin``).

Reading Debian 12's tree (4,023 modules) takes about 30 ms with a warm page cache and 100
to 150 ms cold, once per drop intake judges, beside seconds of verification: not cached.
"""

from __future__ import annotations

import os
from pathlib import Path

from stager.schema.paths import normalize_module_name

IN_TREE = "kernel"  # the kernel's own modules, below the tree


def module_of(path: str) -> str | None:
    """The name the kernel compares for a module file's path (``kernel/lib/crc-itu-t.ko.xz``:
    ``crc_itu_t``), or None when the path is not a ``*.ko`` or ``*.ko.<ext>`` file."""
    stem, ko, rest = path.rsplit("/", 1)[-1].rpartition(".ko")
    if not ko or not stem or (rest and not rest.startswith(".")):
        return None
    return normalize_module_name(stem)


def in_tree_modules(tree: Path) -> dict[str, str]:
    """Each in-tree module of the module tree ``tree`` by name (``-`` as ``_``), with its path
    below ``tree`` (``kernel/lib/crc8.ko``): the files under ``kernel/``, then the
    ``kernel/`` lines of ``modules.dep``. An unreadable directory or a missing
    ``modules.dep`` adds nothing."""
    found: dict[str, str] = {}
    base = len(str(tree)) + 1
    for dirpath, dirnames, filenames in os.walk(tree / IN_TREE):
        dirnames.sort()  # the first of two files of one name is the same on every host
        at = dirpath[base:]
        for filename in sorted(filenames):
            name = module_of(filename)
            if name is not None:
                found.setdefault(name, f"{at}/{filename}")
    for path in _depmod_paths(tree):
        name = module_of(path)
        if name is not None and path.startswith(f"{IN_TREE}/"):
            found.setdefault(name, path)
    return found


def _depmod_paths(tree: Path) -> list[str]:
    """The module paths ``modules.dep`` lists, relative to ``tree`` (depmod writes them so;
    an absolute one under the tree is made relative)."""
    try:
        text = (tree / "modules.dep").read_text(errors="replace")
    except OSError:
        return []
    prefix = f"{tree.name}/"
    paths = []
    for line in text.splitlines():
        path = line.partition(":")[0].strip()
        if path.startswith("/"):
            path = path.partition(f"/{prefix}")[2]
        if path:
            paths.append(path)
    return paths

"""Every symbol the target kernel exports, from its own files, read once per kernel.

The kernel resolves a module's imports against vmlinux and the modules already loaded,
comparing CRCs it carries in those binaries, so the same binaries are the facts:

1. ``boot/vmlinuz-<release>`` (:mod:`service.verify.targetkernel.kimage`) and every in-tree
   module under ``lib/modules/<release>/kernel`` (compressed or not;
   :mod:`service.verify.modfile.symtab`). These are on every host, headers or not. When the
   image cannot be read, these are not used.
2. ``lib/modules/<release>/build/Module.symvers``, where the kernel headers are installed.
   Read beside the first source, it is cross-checked: a symbol whose CRC differs between
   the two is a disagreement that names both files, and a module importing it is refused.
   Alone (no readable image), it is the table.

:class:`KernelExports` is the mapping a :class:`~service.verify.targetkernel.Target` holds; it
reads nothing until a symbol is looked up. The parsed table is cached in
``<var>/cache/exports-<release>`` keyed by the paths, sizes and modification times of the
image, ``modules.dep`` (depmod rewrites it whenever the in-tree modules change) and
``Module.symvers`` (:mod:`service.verify.targetkernel.exports_cache`); a cache that is damaged,
truncated or keyed to other files is rebuilt. ``modstage boot`` never builds it (see
:meth:`KernelExports.probe_only`).
"""

from __future__ import annotations

import os
import threading
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import NamedTuple

from service.errors import ModuleRejected, TargetFileError
from service.verify.modfile.symtab import Export
from service.verify.targetkernel.exports_cache import Table, read_cache, write_cache
from stager.schema.paths import MODULE_SUFFIXES, module_name

_SUFFIXES = MODULE_SUFFIXES  # the container's own list


class Sources(NamedTuple):
    """Where one target kernel's exports may be read."""

    image: Path  # boot/vmlinuz-<release>
    modules: Path  # lib/modules/<release>
    cache: Path | None  # None: no cache is read or written

    @property
    def symvers(self) -> Path:
        """The kernel headers' list of every export."""
        return self.modules / "build" / "Module.symvers"

    @property
    def depmod(self) -> Path:
        """Rewritten by depmod whenever the in-tree modules change."""
        return self.modules / "modules.dep"

    def key(self) -> tuple[object, ...]:
        """The paths and the size and modification time of every file the table is read
        from (None: absent). Not the device and inode: the same files seen through another
        mount (a container's, a test VM's 9p root) keep the same cache."""
        out: list[object] = [str(self.image), str(self.modules)]
        for path in (self.image, self.depmod, self.symvers):
            try:
                st = os.stat(path)
            except OSError:
                out.append(None)
            else:
                out.append((st.st_size, st.st_mtime_ns))
        return tuple(out)


def read_module_exports(path: Path) -> dict[str, Export]:
    """The exports of one installed module file (compressed or not), owned by its name."""
    from service.verify.compressed.decompress import compression, decompress
    from service.verify.modfile.elf import parse_elf
    from service.verify.modfile.symtab import read_symbols

    owner = module_name(path.name)
    try:
        with path.open("rb") as f:
            kind = compression(f.read(6))
            if kind is None:
                size = f.seek(0, os.SEEK_END)
                fd = f.fileno()
                elf = parse_elf(lambda at, n: os.pread(fd, n, at), size)
                found = read_symbols(elf, lambda at, n: os.pread(fd, n, at), exports_only=True)
            else:
                f.seek(0)
                data = decompress(f.read, kind)
                elf = parse_elf(lambda at, n: data[at : at + n], len(data))
                found = read_symbols(elf, lambda at, n: data[at : at + n], exports_only=True)
    except OSError as exc:
        raise TargetFileError(path, f"cannot read: {exc.strerror or exc}") from exc
    except ModuleRejected as exc:
        raise TargetFileError(path, exc.reason) from exc
    return {name: e._replace(owner=owner) for name, e in found.exports.items()}


def read_symvers(path: Path) -> dict[str, Export]:
    """``Module.symvers``: ``0x<crc>\\t<symbol>\\t<module>\\t<export kind>[\\t<namespace>]``."""
    try:
        text = path.read_text(errors="replace")
    except OSError as exc:
        raise TargetFileError(path, f"cannot read: {exc.strerror or exc}") from exc
    out: dict[str, Export] = {}
    for line in text.splitlines():
        fields = line.split("\t")
        if len(fields) < 4 or not fields[0].startswith("0x"):
            continue
        try:
            crc = int(fields[0], 16)
        except ValueError:
            continue
        owner = "vmlinux" if fields[2] == "vmlinux" else module_name(fields[2])
        space = fields[4] if len(fields) > 4 else ""
        out[fields[1]] = Export(crc, fields[3].endswith("_GPL"), space, owner)
    return out


def _in_tree(modules: Path) -> Iterator[Path]:
    for dirpath, dirnames, filenames in os.walk(modules / "kernel"):
        dirnames.sort()
        for name in sorted(filenames):
            if name.endswith(_SUFFIXES):
                yield Path(dirpath) / name


def build(sources: Sources, *, kernel_files: bool = True) -> Table:
    """Read the table from the kernel's files, cross-checked with ``Module.symvers``
    (``kernel_files=False``: from ``Module.symvers`` alone, the quick way)."""
    read: list[str] = []
    problems: list[str] = []
    found = _from_kernel_files(sources, read, problems) if kernel_files else None
    symbols, image_facts = found if found is not None else ({}, (None, None, None))
    complete = found is not None
    disagree: dict[str, str] = {}
    try:
        listed = read_symvers(sources.symvers)
    except TargetFileError as exc:
        if os.path.lexists(sources.symvers):
            problems.append(str(exc))
    else:
        read.append(str(sources.symvers))
        if not complete:
            symbols, complete = listed, True
        else:
            disagree = _disagreements(symbols, listed, sources)
    return Table(symbols, tuple(read), complete, tuple(problems), disagree, *image_facts)


ImageFacts = tuple[frozenset[str] | None, bool | None, bool | None]


def _from_kernel_files(
    sources: Sources, read: list[str], problems: list[str]
) -> tuple[dict[str, Export], ImageFacts] | None:
    """Every export of the image and the in-tree modules, with the image's ``/sys/module``
    names, ``__kflagstab`` and ``module:`` namespaces; None when the image cannot be read.
    What was read is appended to ``read``, what could not to ``problems``."""
    from service.verify.targetkernel.kimage import read_image

    try:
        image = read_image(sources.image)
    except TargetFileError as exc:
        if os.path.lexists(sources.image):
            problems.append(str(exc))
        return None
    symbols = dict(image.exports)
    read.append(str(sources.image))
    count = 0
    for path in _in_tree(sources.modules):
        try:
            for name, export in read_module_exports(path).items():
                # the kernel's own modpost writes no __ksymtab_gpl where the loader
                # ignores it (7.1 on), so the in-tree exports need no such mark
                symbols.setdefault(name, export._replace(gpl_section=False))
            count += 1
        except TargetFileError as exc:
            problems.append(str(exc))
    read.append(f"{count} in-tree modules under {sources.modules / 'kernel'}")
    return symbols, (image.builtin_sysfs, image.kflagstab, image.module_namespaces)


def _disagreements(
    symbols: Mapping[str, Export], listed: Mapping[str, Export], sources: Sources
) -> dict[str, str]:
    """The symbols whose CRC the kernel's files and ``Module.symvers`` give differently."""
    disagree = {}
    for name, export in listed.items():
        mine = symbols.get(name)
        if mine is not None and mine.crc is not None and mine.crc != export.crc:
            where = sources.image if mine.owner == "vmlinux" else f"module {mine.owner}"
            disagree[name] = (
                f"{where} gives CRC {mine.crc:#010x}, {sources.symvers} gives {export.crc:#010x}"
            )
    return disagree


def load(sources: Sources, *, quick: bool = False) -> tuple[Table, str | None]:
    """The table, from the cache when it is current; (table, what went wrong with the cache).

    ``quick``: when the cache is not current, read ``Module.symvers`` alone (or nothing)
    and write no cache: what a boot explaining a refused load may spend.
    """
    key = sources.key()
    table, why = read_cache(sources.cache, key)
    if table is not None:
        return table, None
    if quick:
        return build(sources, kernel_files=False), why
    table = build(sources)
    return table, write_cache(sources.cache, table, key) or why


class KernelExports(Mapping[str, Export]):
    """A target's exports, read on first lookup (see the module docstring).

    ``probe``: CRCs from one in-tree module's ``__versions`` (``module_layout`` among them),
    known without reading anything else: what boot judges with.
    """

    def __init__(
        self, sources: Sources | None, probe: Mapping[str, Export], *, quick: bool = False
    ) -> None:
        self.sources, self.probe, self.quick = sources, dict(probe), quick
        self._table: Table | None = None
        self._lock = threading.Lock()  # verification threads share one target
        self.cache_note: str | None = None

    @classmethod
    def known(cls, symbols: Mapping[str, Export], source: str) -> KernelExports:
        """Exports given whole (every export of the target), read from ``source``."""
        exports = cls(None, {})
        exports._table = Table(symbols, (source,), True, (), {})
        return exports

    def cached_only(self) -> KernelExports:
        """The same target reading the cache if it is current, else ``Module.symvers`` alone:
        never the kernel's files (seconds, minutes under emulation), never writing."""
        return KernelExports(self.sources, self.probe, quick=True)

    def probe_only(self) -> KernelExports:
        """The same target knowing only the probed CRCs (nothing more is ever read)."""
        return KernelExports(None, self.probe)

    @property
    def table(self) -> Table:
        """The whole table (read now if it was not yet)."""
        with self._lock:
            if self._table is None:
                self._table = self._read()
            return self._table

    def _read(self) -> Table:
        if self.sources is None:
            return Table(self.probe, (), False, (), {})
        table, self.cache_note = load(self.sources, quick=self.quick)
        if not table.complete:
            table = table._replace(symbols={**self.probe, **table.symbols})
        return table

    @property
    def complete(self) -> bool:
        """Whether every export of the target is known."""
        return self.table.complete

    def describe(self) -> str:
        """Where the exports came from, for the verdict's notes."""
        table = self.table
        if self.sources is None and not table.complete:
            return f"only the {len(self.probe)} CRCs of the probed in-tree module's __versions"
        said = " + ".join(table.sources) or "nothing readable"
        if not table.complete:
            said += f"; only {len(table.symbols)} CRCs known (the probed in-tree module's)"
        return said

    def __getitem__(self, name: str) -> Export:
        return self.table.symbols[name]

    def __contains__(self, name: object) -> bool:
        return name in self.table.symbols

    def __iter__(self) -> Iterator[str]:
        return iter(self.table.symbols)

    def __len__(self) -> int:
        return len(self.table.symbols)

    def __repr__(self) -> str:
        state = "unread" if self._table is None else f"{len(self._table.symbols)} symbols"
        return f"KernelExports({self.sources}, {state})"

"""Every symbol the target kernel exports, from its own files, read once per kernel.

The kernel resolves a module's imports against vmlinux and the modules already loaded,
comparing CRCs it carries in those binaries, so the same binaries are the facts:

1. ``boot/vmlinuz-<release>`` (:mod:`service.verify.kimage`) and every in-tree module under
   ``lib/modules/<release>/kernel`` (compressed or not; :mod:`service.verify.symtab`). These
   are on every host, headers or not. When the image cannot be read, these are not used.
2. ``lib/modules/<release>/build/Module.symvers``, where the kernel headers are installed.
   Read beside the first source, it is cross-checked: a symbol whose CRC differs between
   the two is a disagreement that names both files, and a module importing it is refused.
   Alone (no readable image), it is the table.

:class:`KernelExports` is the mapping a :class:`~service.verify.target.Target` holds; it
reads nothing until a symbol is looked up. The parsed table is cached in
``<var>/cache/exports-<release>`` keyed by the paths, sizes and modification times of the
image, ``modules.dep`` (depmod rewrites it whenever the in-tree modules change) and
``Module.symvers``; a cache that is damaged, truncated or keyed to other files is rebuilt.
``modstage boot`` never builds it (see :meth:`KernelExports.probe_only`).
"""

from __future__ import annotations

import hashlib
import marshal
import os
import threading
import zlib
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any, NamedTuple

from service.errors import ModuleRejected, TargetFileError
from service.verify.symtab import Export
from stager.paths import module_name

CACHE_FORMAT = b"modstage-exports 2\n"
BUCKETS = 256
_SUFFIXES = (".ko", ".ko.xz", ".ko.zst", ".ko.gz")
_NO_CRC = 1 << 32


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


class Table(NamedTuple):
    """A target's exports and how they were found."""

    symbols: Mapping[str, Export]
    sources: tuple[str, ...]  # the files the table was read from, first source first
    complete: bool  # every export is known: the image (or Module.symvers) was read
    problems: tuple[str, ...]  # files that could not be used, each with why
    disagree: dict[str, str]  # symbol -> the two files and the CRCs they give


def read_module_exports(path: Path) -> dict[str, Export]:
    """The exports of one installed module file (compressed or not), owned by its name."""
    from service.verify.decompress import compression, decompress
    from service.verify.modinfo import parse_elf
    from service.verify.symtab import read_symbols

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
    from service.verify.kimage import read_image_exports

    symbols: dict[str, Export] = {}
    read: list[str] = []
    problems: list[str] = []
    complete = False
    try:
        if not kernel_files:
            raise TargetFileError(sources.image, "not read (a quick lookup)")
        symbols.update(read_image_exports(sources.image))
        read.append(str(sources.image))
        complete = True
    except TargetFileError as exc:
        if os.path.lexists(sources.image) and kernel_files:
            problems.append(str(exc))
    if complete:
        count = 0
        for path in _in_tree(sources.modules):
            try:
                for name, export in read_module_exports(path).items():
                    symbols.setdefault(name, export)
                count += 1
            except TargetFileError as exc:
                problems.append(str(exc))
        read.append(f"{count} in-tree modules under {sources.modules / 'kernel'}")
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
            for name, export in listed.items():
                mine = symbols.get(name)
                if mine is not None and mine.crc is not None and mine.crc != export.crc:
                    where = sources.image if mine.owner == "vmlinux" else f"module {mine.owner}"
                    disagree[name] = (
                        f"{where} gives CRC {mine.crc:#010x}, "
                        f"{sources.symvers} gives {export.crc:#010x}"
                    )
    return Table(symbols, tuple(read), complete, tuple(problems), disagree)


def _bucket(name: str) -> int:
    """Which of the cache's :data:`BUCKETS` holds ``name`` (the same in every process)."""
    return zlib.crc32(name.encode()) % BUCKETS


def _pack(table: Table, key: tuple[object, ...]) -> bytes:
    spaces: dict[str, int] = {"": 0}
    owners: dict[str, int] = {}
    buckets: list[dict[str, int]] = [{} for _ in range(BUCKETS)]
    for name, e in table.symbols.items():
        space = spaces.setdefault(e.namespace, len(spaces))
        owner = owners.setdefault(e.owner, len(owners))
        crc = _NO_CRC if e.crc is None else e.crc
        buckets[_bucket(name)][name] = crc | e.gpl << 33 | space << 34 | owner << 50
    fields: Any = (
        key, [marshal.dumps(b) for b in buckets], list(spaces), list(owners),
        list(table.sources), table.complete, list(table.problems), table.disagree,
    )  # fmt: skip
    body = marshal.dumps(fields)  # the key holds only str, int, tuples and None
    return CACHE_FORMAT + hashlib.sha256(body).hexdigest().encode() + b"\n" + body


def _unpack(data: bytes, key: tuple[object, ...]) -> Table:
    """The table a cache file holds, if it is whole and keyed to ``key``; else ValueError."""
    if not data.startswith(CACHE_FORMAT):
        raise ValueError("not a modstage exports cache of this format")
    digest, _, body = data[len(CACHE_FORMAT) :].partition(b"\n")
    if hashlib.sha256(body).hexdigest().encode() != digest:
        raise ValueError("checksum mismatch (damaged or truncated)")
    stored, buckets, spaces, owners, read, complete, problems, disagree = marshal.loads(body)
    if tuple(stored) != key:
        raise ValueError("built from other files")
    if len(buckets) != BUCKETS:
        raise ValueError(f"{len(buckets)} buckets, not {BUCKETS}")
    symbols = Packed(buckets, spaces, owners)
    return Table(symbols, tuple(read), complete, tuple(problems), dict(disagree))


class Packed(Mapping[str, Export]):
    """A cached table's symbols, in :data:`BUCKETS` buckets each read when a name in it is
    first looked up: a small bundle's imports touch a few buckets, not 25,000 records."""

    def __init__(self, buckets: list[bytes], spaces: list[str], owners: list[str]) -> None:
        self.buckets, self.spaces, self.owners = buckets, spaces, owners
        self._read: dict[int, dict[str, int]] = {}

    def _packed(self, name: str) -> dict[str, int]:
        at = _bucket(name)
        if at not in self._read:
            self._read[at] = marshal.loads(self.buckets[at])
        return self._read[at]

    def __getitem__(self, name: str) -> Export:
        value = self._packed(name)[name]
        crc = value & (_NO_CRC | (_NO_CRC - 1))
        return Export(
            None if crc == _NO_CRC else crc,
            bool(value >> 33 & 1),
            self.spaces[value >> 34 & 0xFFFF],
            self.owners[value >> 50],
        )

    def __contains__(self, name: object) -> bool:
        return isinstance(name, str) and name in self._packed(name)

    def __iter__(self) -> Iterator[str]:
        for at in range(BUCKETS):
            if at not in self._read:
                self._read[at] = marshal.loads(self.buckets[at])
            yield from self._read[at]

    def __len__(self) -> int:
        return sum(1 for _ in self)


def load(sources: Sources, *, quick: bool = False) -> tuple[Table, str | None]:
    """The table, from the cache when it is current; (table, what went wrong with the cache).

    ``quick``: when the cache is not current, read ``Module.symvers`` alone (or nothing)
    and write no cache: what a boot explaining a refused load may spend.
    """
    from stager.atomic import write_atomic

    key = sources.key()
    why = None
    if sources.cache is not None:
        try:
            return _unpack(sources.cache.read_bytes(), key), None
        except FileNotFoundError:
            pass
        except (OSError, ValueError, EOFError, TypeError) as exc:
            why = f"cache {sources.cache} unusable ({exc}); rebuilt"
    if quick:
        return build(sources, kernel_files=False), why
    table = build(sources)
    if sources.cache is not None and sources.cache.parent.parent.is_dir():
        try:
            sources.cache.parent.mkdir(mode=0o700, exist_ok=True)
            write_atomic(sources.cache, _pack(table, key), 0o600)
        except OSError as exc:
            why = f"cache {sources.cache} not written ({exc.strerror or exc})"
    return table, why


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

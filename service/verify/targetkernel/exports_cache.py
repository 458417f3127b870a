"""The cache of a target's parsed exports: one file per kernel release, read in parts.

:class:`Table` is what is read from the target's files (and what the cache holds); the
cache is keyed by those files' paths, sizes and modification times
(:meth:`service.verify.targetkernel.exports.Sources.key`). The file is a format line, the SHA-256 of
the body and the body, marshalled: the symbols in :data:`BUCKETS` buckets, each
unmarshalled when a name in it is first looked up (:class:`Packed`). A file that is
damaged, truncated, of another format or keyed to other files is not used
(:func:`read_cache` says why); it is written atomically.
"""

from __future__ import annotations

import hashlib
import marshal
import zlib
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any, NamedTuple

from service.verify.modfile.symtab import Export

CACHE_FORMAT = b"modstage-exports 5\n"
BUCKETS = 256
_NO_CRC = 1 << 32


class Table(NamedTuple):
    """A target's exports and how they were found."""

    symbols: Mapping[str, Export]
    sources: tuple[str, ...]  # the files the table was read from, first source first
    complete: bool  # every export is known: the image (or Module.symvers) was read
    problems: tuple[str, ...]  # files that could not be used, each with why
    disagree: dict[str, str]  # symbol -> the two files and the CRCs they give
    # the /sys/module names the image gives built-in code (kimage.builtin_sysfs); None: the
    # image was not read
    builtin_sysfs: frozenset[str] | None = None
    # the image has __kflagstab (7.2): a module exporting symbols must have one too
    kflagstab: bool | None = None
    # the image's loader knows `module:` namespaces (kimage.MODULE_NAMESPACE_LOADER)
    module_namespaces: bool | None = None


def _bucket(name: str) -> int:
    """Which of the cache's :data:`BUCKETS` holds ``name`` (the same in every process)."""
    return zlib.crc32(name.encode()) % BUCKETS


def pack(table: Table, key: tuple[object, ...]) -> bytes:
    """A cache file's bytes: the format line, the body's SHA-256, the marshalled body."""
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
        None if table.builtin_sysfs is None else sorted(table.builtin_sysfs),
        table.kflagstab, table.module_namespaces,
    )  # fmt: skip
    body = marshal.dumps(fields)  # the key holds only str, int, tuples and None
    return CACHE_FORMAT + hashlib.sha256(body).hexdigest().encode() + b"\n" + body


def unpack(data: bytes, key: tuple[object, ...]) -> Table:
    """The table a cache file holds, if it is whole and keyed to ``key``; else ValueError."""
    if not data.startswith(CACHE_FORMAT):
        raise ValueError("not a modstage exports cache of this format")
    digest, _, body = data[len(CACHE_FORMAT) :].partition(b"\n")
    if hashlib.sha256(body).hexdigest().encode() != digest:
        raise ValueError("checksum mismatch (damaged or truncated)")
    (stored, buckets, spaces, owners, read, complete, problems, disagree, sysfs, flags,
     namespaces) = marshal.loads(body)  # fmt: skip
    if tuple(stored) != key:
        raise ValueError("built from other files")
    if len(buckets) != BUCKETS:
        raise ValueError(f"{len(buckets)} buckets, not {BUCKETS}")
    symbols = Packed(buckets, spaces, owners)
    builtin = None if sysfs is None else frozenset(sysfs)
    return Table(
        symbols, tuple(read), complete, tuple(problems), dict(disagree), builtin, flags, namespaces
    )


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


def read_cache(path: Path | None, key: tuple[object, ...]) -> tuple[Table | None, str | None]:
    """The table cached at ``path`` if it is current for ``key``; else (None, why the file
    there was not usable, if there was one)."""
    if path is None:
        return None, None
    try:
        return unpack(path.read_bytes(), key), None
    except FileNotFoundError:
        return None, None
    except (OSError, ValueError, EOFError, TypeError) as exc:
        return None, f"cache {path} unusable ({exc}); rebuilt"


def write_cache(path: Path | None, table: Table, key: tuple[object, ...]) -> str | None:
    """Cache ``table`` at ``path`` (where its directory's parent exists); what went wrong."""
    from stager.schema.atomic import write_atomic

    if path is None or not path.parent.parent.is_dir():
        return None
    try:
        path.parent.mkdir(mode=0o700, exist_ok=True)
        write_atomic(path, pack(table, key), 0o600)
    except OSError as exc:
        return f"cache {path} not written ({exc.strerror or exc})"
    return None

"""The target's exported symbols' CRCs, read only when a module's ``__versions`` asks.

``build/Module.symvers`` of a distribution kernel holds about 25,000 lines; parsing them
costs more than everything else ``modstage boot`` does for a small bundle, and a boot
with nothing to load never needs them. :class:`SymbolCrcs` is the mapping
:class:`~service.verify.target.Target` holds: it knows its sources at once (whether the
file can be opened) and reads them on first use.

A line is ``0x<crc>\\t<symbol>\\t<module>\\t<export kind>[\\t<namespace>]``; lines whose
first field is not a ``0x`` number are skipped. Later lines win, and the file
wins over the probed module's ``__versions``.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Iterator, Mapping
from pathlib import Path


def readable(path: Path) -> bool:
    """Whether ``path`` can be opened for reading now."""
    try:
        os.close(os.open(path, os.O_RDONLY | os.O_CLOEXEC))
    except OSError:
        return False
    return True


def parse_symvers(lines: Iterable[str]) -> dict[str, int]:
    """Symbol -> CRC of ``Module.symvers`` lines; a line without a ``0x`` CRC is skipped."""
    out: dict[str, int] = {}
    for line in lines:
        fields = line.split("\t")
        if len(fields) >= 2 and fields[0].startswith("0x"):
            try:
                out[fields[1]] = int(fields[0], 16)
            except ValueError:
                continue
    return out


class SymbolCrcs(Mapping[str, int]):
    """CRCs of ``base`` (a probed module's ``__versions``) updated by ``Module.symvers``.

    The file is read on first use; ``symvers`` is None when it could not be opened.
    """

    def __init__(self, base: Mapping[str, int], symvers: Path | None) -> None:
        self.base, self.symvers = dict(base), symvers
        self._crcs: dict[str, int] | None = None if symvers is not None else self.base

    def _load(self) -> dict[str, int]:
        if self._crcs is None:
            crcs = dict(self.base)
            try:
                with open(self.symvers or "", errors="replace") as f:
                    crcs.update(parse_symvers(f))
            except OSError:
                pass  # it was readable a moment ago: what was read stands
            self._crcs = crcs
        return self._crcs

    def __getitem__(self, name: str) -> int:
        return self._load()[name]

    def __contains__(self, name: object) -> bool:
        return name in self._load()

    def __iter__(self) -> Iterator[str]:
        return iter(self._load())

    def __len__(self) -> int:
        return len(self._load())

    def __repr__(self) -> str:
        return f"SymbolCrcs({len(self.base)} probed, {self.symvers})"

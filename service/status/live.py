"""What the kernel says about a bundle's modules: ``/sys/module/<name>`` under the root.

``status`` compares these facts with what ``state.json`` recorded, so it never
reports a generation as up when its modules are not live.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

from service.bundles.records import ModuleLoad


@dataclass(frozen=True)
class LiveModule:
    """One live module as sysfs shows it (None: the file is absent or unreadable)."""

    name: str
    srcversion: str | None
    version: str | None
    refcnt: int | None


def _text(path: Path) -> str | None:
    try:
        return path.read_text().strip()
    except (OSError, UnicodeDecodeError):
        return None


def live_module(sys_root: Path, name: str) -> LiveModule | None:
    """The module ``name`` if ``<sys>/module/<name>`` exists, else None."""
    base = sys_root / "module" / name
    if not base.is_dir():
        return None
    refcnt = _text(base / "refcnt")
    return LiveModule(
        name,
        _text(base / "srcversion"),
        _text(base / "version"),
        int(refcnt) if refcnt is not None and refcnt.isdigit() else None,
    )


def live_modules(sys_root: Path, names: Iterable[str]) -> dict[str, LiveModule | None]:
    """:func:`live_module` for each name."""
    return {n: live_module(sys_root, n) for n in names}


def module_mismatches(
    loaded: Iterable[ModuleLoad], live: Mapping[str, LiveModule | None]
) -> tuple[list[str], list[str]]:
    """(missing, differing): recorded modules not live, and live with another srcversion."""
    missing, differing = [], []
    for m in loaded:
        now = live.get(m.module)
        if now is None:
            missing.append(m.module)
        elif m.srcversion and now.srcversion and now.srcversion != m.srcversion:
            differing.append(
                f"{m.module} (srcversion {now.srcversion} live, {m.srcversion} recorded)"
            )
    return missing, differing

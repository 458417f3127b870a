"""What must hold on a host tree whatever moment modstage was killed at."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

from service.bundles.state import State
from service.bundles.statefile import decode
from service.intake.owners import NAMES
from service.layout import Layout
from stager.schema.manifest import Manifest
from stager.schema.paths import MANIFEST_NAME, parse_drop_name


def state_of(layout: Layout) -> State:
    """state.json parsed (empty if absent); fails the test if it does not parse."""
    if not layout.state.exists():
        return State()
    return decode(layout.state.read_bytes())


def published_problems(layout: Layout) -> list[str]:
    """Every store directory but ``.tmp-*`` is complete and matches its manifest (beside
    which intake records the names its modules register)."""
    problems: list[str] = []
    if not layout.store.is_dir():
        return problems
    for gen in sorted(layout.store.iterdir()):
        if gen.name.startswith(".tmp-"):
            continue
        try:
            manifest = Manifest.from_toml((gen / MANIFEST_NAME).read_bytes())
        except (OSError, ValueError) as exc:
            problems.append(f"{gen.name}: no readable manifest: {exc}")
            continue
        if manifest.digest != gen.name:
            problems.append(f"{gen.name}: manifest digest is {manifest.digest}")
        entries = {m.file: m.sha256 for m in manifest.modules}
        entries |= {f.file: f.sha256 for f in manifest.firmware}
        present = {
            str((Path(d) / n).relative_to(gen))
            for d, _dirs, files in os.walk(gen)
            for n in files
            if n not in (MANIFEST_NAME, NAMES) or Path(d) != gen
        }
        if present != set(entries):
            problems.append(f"{gen.name}: files {sorted(present ^ set(entries))} differ")
        for rel, digest in entries.items():
            path = gen / rel
            if path.is_file() and hashlib.sha256(path.read_bytes()).hexdigest() != digest:
                problems.append(f"{gen.name}: {rel} does not match its digest")
    return problems


def complete_drops(layout: Layout) -> list[Path]:
    """Drops in incoming/ that a reader would take (manifest present)."""
    if not layout.incoming.is_dir():
        return []
    return sorted(
        p
        for p in layout.incoming.iterdir()
        if parse_drop_name(p.name) and os.path.lexists(p / MANIFEST_NAME)
    )


def not_lost(layout: Layout, bundle: str, generation: str) -> bool:
    """The staged generation is still on its way: a complete drop, or pending/active."""
    b = state_of(layout).bundle(bundle)
    if generation in (b.pending, b.active) and generation in b.generations:
        return True
    return any(
        Manifest.from_toml((d / MANIFEST_NAME).read_bytes()).digest == generation
        for d in complete_drops(layout)
        if (d / MANIFEST_NAME).is_file()
    )

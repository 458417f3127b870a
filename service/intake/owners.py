"""Which bundle owns which module: one bundle per module name.

The kernel loads a module name once, so two bundles carrying the same module cannot both
come up: at boot the bundle loaded first takes the name and the other fails, or, when the
module is the same build, the other "finds" it loaded with the first bundle's parameters.
A bundle owns the modules of its active and pending generations (the generations a boot
may load), by the name the kernel registers (``struct module``'s, in
``.gnu.linkonce.this_module``), never the file's: a signed module renamed to ``aaa.ko``
still registers its own name. Intake records each generation's registered names in the
store beside its manifest (:func:`record_names`) and refuses a drop carrying a module
another bundle owns (:func:`service.intake.admit.claimed_modules`); an admin's ``retry`` or
``rollback`` that would make a generation pending whose modules another bundle owns now is
refused the same way (:func:`verb_claims`): a generation that was retained while it was
neither active nor pending owns nothing, so another bundle may have taken its modules since.

Firmware is owned the same way: the file names below ``firmware/`` the active and pending
generations of a bundle carry (:func:`firmware_owners`, refused in another bundle's drop by
:func:`service.intake.firmware_names.firmware_problems`): the firmware view links one file per name.
"""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import BinaryIO

from service.bundles.state import State
from service.errors import ModuleRejected
from service.generations.store import Store
from service.intake.firmware_names import PREFIX, answered, requests_of
from service.verify.compressed.decompress import compression, decompress_into
from service.verify.modfile.modinfo import ModInfo
from stager.schema.atomic import write_atomic
from stager.schema.failures import ManifestError
from stager.schema.manifest import Manifest
from stager.schema.paths import normalize_module_name

LOADER_SUFFIXES = ("", ".zst", ".xz")  # every suffix a target's firmware loader may try

# beside manifest.toml in a published generation; no drop file can be named so (module
# files end in .ko*, firmware lies under firmware/)
NAMES = "registered.json"


def record_names(directory: Path, names: Mapping[str, str]) -> None:
    """Record in a generation's directory (before it is published) the name each module
    file registers: ``names`` maps the file as the manifest names it to that name."""
    write_atomic(directory / NAMES, json.dumps(dict(names), sort_keys=True).encode(), mode=0o444)


def registered_names(store: Store, generation: str, manifest: Manifest) -> dict[str, str]:
    """Module file -> the name it registers, for a published generation.

    A generation published before the names were recorded has no record: its stored modules
    are read for the name (owning its file's name only, a renamed module would let another
    bundle take the name it registers), and a module that cannot be read owns its file's
    name (the boot refuses it anyway)."""
    try:
        recorded = json.loads((store.path(generation) / NAMES).read_bytes())
    except (OSError, ValueError):
        recorded = {}
    names = {}
    for module in manifest.modules:
        name = recorded.get(module.file) if isinstance(recorded, dict) else None
        if not isinstance(name, str):
            name = stored_name(store.path(generation) / module.file, store.root) or module.name
        names[module.file] = normalize_module_name(name)
    return names


@dataclass(frozen=True)
class Owners:
    """What the other bundles' active and pending generations own: each registered module
    name, each firmware entry (``firmware/...``), -> (bundle, generation)."""

    modules: Mapping[str, tuple[str, str]] = field(default_factory=dict)
    firmware: Mapping[str, tuple[str, str]] = field(default_factory=dict)


def _kept(state: State, store: Store, bundle: str) -> Iterator[tuple[str, str, Manifest]]:
    """(bundle, generation, manifest) of the active and pending generations of the bundles
    other than ``bundle`` (a generation gone from the store owns nothing)."""
    for name, other in sorted(state.bundles.items()):
        for generation in sorted(other.keep()) if name != bundle else ():
            try:
                yield name, generation, store.manifest(generation)
            except (OSError, ManifestError):
                continue


def stored_name(path: Path, scratch: Path) -> str | None:
    """The name a stored module file registers, or None when it cannot be read. A compressed
    one is decompressed into an unnamed file in ``scratch``, never into memory (as intake
    does)."""
    try:
        with path.open("rb") as f:
            kind = compression(f.read(6))
            if kind is None:
                return _elf_name(f)
            with tempfile.TemporaryFile(dir=scratch) as image:
                decompress_into(f, kind, image)
                return _elf_name(image)
    except (OSError, ModuleRejected):
        return None


def _elf_name(f: BinaryIO) -> str | None:
    size = os.fstat(f.fileno()).st_size
    fd = f.fileno()
    return ModInfo.from_elf(lambda at, n: os.pread(fd, n, at), size).module_name


def module_owners(state: State, store: Store, bundle: str) -> dict[str, tuple[str, str]]:
    """Registered module name -> (bundle, generation) for the active and pending generations
    of the bundles other than ``bundle``."""
    owners: dict[str, tuple[str, str]] = {}
    for name, generation, manifest in _kept(state, store, bundle):
        names = registered_names(store, generation, manifest)
        owners.update({m: (name, generation) for m in names.values()})
    return owners


def firmware_owners(state: State, store: Store, bundle: str) -> dict[str, tuple[str, str]]:
    """Firmware entry (``firmware/...``) -> (bundle, generation) for the active and pending
    generations of the bundles other than ``bundle``."""
    return {
        f.file: (name, generation)
        for name, generation, manifest in _kept(state, store, bundle)
        for f in manifest.firmware
    }


def owners_of(state: State, store: Store, bundle: str) -> Owners:
    """What the bundles other than ``bundle`` own (what a drop of ``bundle`` may not carry)."""
    return Owners(module_owners(state, store, bundle), firmware_owners(state, store, bundle))


def verb_claims(state: State, store: Store, bundle: str, generation: str) -> list[str]:
    """Why ``generation`` of ``bundle`` cannot be made pending: each of its modules another
    bundle owns now (an unreadable generation claims nothing here: the boot says why)."""
    try:
        manifest = store.manifest(generation)
    except (OSError, ManifestError):
        return []
    owners = module_owners(state, store, bundle)
    problems = []
    for file, name in registered_names(store, generation, manifest).items():
        owner = owners.get(name)
        if owner is None:
            continue
        other, theirs = owner
        problems.append(
            f"generation {generation[:12]} loads module {name!r} ({file}), which bundle "
            f"{other!r} owns now (generation {theirs[:12]}): the kernel loads a module once; "
            f"modstage forget {other} first if that bundle is the mistake"
        )
    return problems + _firmware_claims(state, store, bundle, generation, manifest)


def _firmware_claims(
    state: State, store: Store, bundle: str, generation: str, manifest: Manifest
) -> list[str]:
    """Each firmware file of ``generation`` answering a request a file of another bundle's
    active or pending generation answers (with every suffix a loader may try: the verbs do
    not read the target's config, and a name too many refused only asks for a forget)."""
    theirs = requests_of(firmware_owners(state, store, bundle), LOADER_SUFFIXES)
    problems = []
    for f in manifest.firmware:
        for request in answered(f.file.removeprefix(PREFIX), LOADER_SUFFIXES):
            if request in theirs:
                entry, other, held = theirs[request]
                problems.append(
                    f"generation {generation[:12]} carries {f.file}, and bundle {other!r} "
                    f"carries {entry} now (generation {held[:12]}): one file answers a "
                    f"firmware request; modstage forget {other} first if that bundle is the "
                    "mistake"
                )
                break
    return problems

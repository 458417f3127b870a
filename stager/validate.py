"""Schema 1 validation: every problem collected, each naming its key, raised once."""

from __future__ import annotations

import re
from typing import Any, TypeVar

from stager.errors import ManifestError
from stager.manifest import (
    MAX_MANIFEST_BYTES,
    SCHEMA,
    FirmwareEntry,
    Manifest,
    MemoryPolicy,
    ModuleEntry,
)
from stager.paths import bundle_problem
from stager.record import RecordError, describe, load
from stager.record import kind as kind_of
from stager.shown import shown

_TEXT = re.compile(r"[A-Za-z0-9][A-Za-z0-9._+~:-]{0,127}\Z")
_TOP = {"schema", "bundle", "version", "kernel", "after", "module", "firmware", "memory"}
_MEMORY = {"auto_online_blocks"}
E = TypeVar("E", ModuleEntry, FirmwareEntry)
MAX_MODULES = 256
MAX_FIRMWARE = 4096
MAX_AFTER = 256
MAX_PROBLEMS = 50
MAX_PROBLEM_CHARS = 512


class _Problems:
    """Problems found so far: at most :data:`MAX_PROBLEMS` kept, each escaped and bounded.

    A manifest is written by a container: a megabyte of unknown keys must not become a
    megabyte-long error in a status file, a log line or a terminal.
    """

    def __init__(self) -> None:
        self.items: list[str] = []
        self.dropped = 0

    def add(self, key: str, message: str) -> None:
        self.add_problem(f"{key}: {message}")

    def add_problem(self, problem: str) -> None:
        if len(self.items) >= MAX_PROBLEMS:
            self.dropped += 1
            return
        self.items.append(shown(problem, MAX_PROBLEM_CHARS))

    def all(self) -> list[str]:
        more = [f"... and {self.dropped} more problems"] if self.dropped else []
        return self.items + more

    def unknown(self, table: dict[str, Any], allowed: set[str], prefix: str) -> None:
        for key in sorted(set(table) - allowed):
            self.add(f"{prefix}{shown(key, 64)}", "unknown key")

    def typed(self, table: dict[str, Any], key: str, kind: type, prefix: str = "") -> Any:
        if key not in table:
            self.add(prefix + key, "missing")
            return None
        value = table[key]
        if not isinstance(value, kind) or isinstance(value, bool) is not (kind is bool):
            self.add(prefix + key, f"must be {describe(kind)}, not {kind_of(value)}")
            return None
        return value


def validate(data: dict[str, Any], source: str) -> Manifest:
    """Build a :class:`Manifest` from a parsed table or raise every problem at once."""
    p = _Problems()
    p.unknown(data, _TOP, "")
    schema = p.typed(data, "schema", int)
    if schema is not None and schema != SCHEMA:
        p.add("schema", f"unknown schema {schema} (this modstage reads schema {SCHEMA})")
        raise ManifestError(p.all(), source)
    bundle = p.typed(data, "bundle", str)
    if bundle is not None and (why := bundle_problem(bundle)):
        p.add("bundle", why)
    for key in ("version", "kernel"):
        text = p.typed(data, key, str)
        if text is not None and not _TEXT.match(text):
            p.add(
                key,
                f"{text!r} is not a plain token (letters, digits, '.', '_', '+', "
                "'~', ':', '-'; at most 128)",
            )
    after = _after(p, data.get("after", []), bundle)
    modules = _modules(p, data)
    firmware = _entries(p, data.get("firmware", []), "firmware", MAX_FIRMWARE, FirmwareEntry)
    memory = _memory(p, data.get("memory"))
    _duplicates(p, modules, firmware)
    if p.items:
        raise ManifestError(p.all(), source)
    manifest = Manifest(
        bundle=bundle,
        version=data["version"],
        kernel=data["kernel"],
        modules=tuple(modules),
        firmware=tuple(firmware),
        after=after,
        memory=memory,
    )
    canonical = len(manifest.to_toml())
    if canonical > MAX_MANIFEST_BYTES:  # what the store keeps, and boot reads back
        p.add("manifest", f"canonical form is {canonical} bytes, over {MAX_MANIFEST_BYTES}")
        raise ManifestError(p.all(), source)
    return manifest


def _duplicates(p: _Problems, modules: list[ModuleEntry], firmware: list[FirmwareEntry]) -> None:
    """A file listed twice (module or firmware), a module name loaded twice."""
    seen: dict[str, str] = {}
    for key, entry in [(f"module[{i}]", m) for i, m in enumerate(modules)] + [
        (f"firmware[{i}]", f) for i, f in enumerate(firmware)
    ]:
        if entry.file in seen:
            p.add(f"{key}.file", f"{entry.file!r} is already listed as {seen[entry.file]}.file")
        seen.setdefault(entry.file, key)
    names: dict[str, int] = {}
    for i, m in enumerate(modules):
        if m.name in names:
            p.add(
                f"module[{i}].file",
                f"module name {m.name!r} is already loaded by module[{names[m.name]}]",
            )
        names.setdefault(m.name, i)


def _after(p: _Problems, value: Any, bundle: str | None) -> tuple[str, ...]:
    if not isinstance(value, list):
        p.add("after", f"must be an array, not {kind_of(value)}")
        return ()
    if len(value) > MAX_AFTER:
        p.add("after", f"{len(value)} entries, more than {MAX_AFTER}")
        return ()
    out: list[str] = []
    seen: set[str] = set()
    for i, name in enumerate(value):
        key = f"after[{i}]"
        if not isinstance(name, str):
            p.add(key, f"must be a string, not {kind_of(name)}")
        elif why := bundle_problem(name):
            p.add(key, why)
        elif name == bundle:
            p.add(key, "a bundle cannot load after itself")
        elif name in seen:
            p.add(key, f"{name!r} is listed twice")
        else:
            out.append(name)
            seen.add(name)
    return tuple(out)


def _tables(p: _Problems, value: Any, key: str, limit: int) -> list[dict[str, Any]]:
    if not isinstance(value, list):
        p.add(key, f"must be an array of tables, not {kind_of(value)}")
        return []
    if len(value) > limit:
        p.add(key, f"more than {limit} entries")
        return []
    tables = []
    for i, item in enumerate(value):
        if isinstance(item, dict):
            tables.append(item)
        else:
            p.add(f"{key}[{i}]", f"must be a table, not {kind_of(item)}")
    return tables if len(tables) == len(value) else []


def _modules(p: _Problems, data: dict[str, Any]) -> list[ModuleEntry]:
    if "module" not in data:
        p.add("module", "missing (a bundle loads at least one module)")
        return []
    if isinstance(data["module"], list) and not data["module"]:
        p.add("module", "empty (a bundle loads at least one module)")
    return _entries(p, data["module"], "module", MAX_MODULES, ModuleEntry)


def _entries(p: _Problems, value: Any, key: str, limit: int, entry: type[E]) -> list[E]:
    """Each table of the array ``key`` as an ``entry`` record, its fields' checks applied."""
    out = []
    for i, table in enumerate(_tables(p, value, key, limit)):
        try:
            out.append(load(entry, table, f"{key}[{i}]"))
        except RecordError as exc:
            for problem in exc.problems:
                p.add_problem(problem)
    return out


def _memory(p: _Problems, value: Any) -> MemoryPolicy | None:
    if value is None:
        return None
    if not isinstance(value, dict):
        p.add("memory", f"must be a table, not {kind_of(value)}")
        return None
    p.unknown(value, _MEMORY, "memory.")
    policy = p.typed(value, "auto_online_blocks", str, "memory.")
    if policy is None:
        return None
    try:
        return MemoryPolicy(policy)
    except ValueError:
        allowed = "|".join(m.value for m in MemoryPolicy)
        p.add("memory.auto_online_blocks", f"{policy!r} is not one of {allowed}")
        return None

"""The drop manifest, schema 1: frozen values, TOML in and out, a canonical digest.

``Manifest.from_toml`` validates everything and reports every problem at once,
each naming its key (``module[2].sha256: ...``). ``to_toml`` writes a canonical
byte form, so the digest of a manifest (the id of the generation it becomes)
does not depend on key order, whitespace or comments in what the container wrote.
See docs/manifest.md for the format.
"""

from __future__ import annotations

import hashlib
import re
import tomllib
from dataclasses import dataclass, field
from enum import StrEnum
from pathlib import Path
from typing import Any, TypeVar

import tomli_w

from stager.schema.failures import ManifestError
from stager.schema.params import ParamsError, parse_params
from stager.schema.paths import (
    MANIFEST_NAME,
    MODULE_SUFFIXES,
    bundle_problem,
    module_name,
    relpath_problem,
)
from stager.schema.record import Loader, Problems, RecordError, describe, dump, kind, load, spec
from stager.schema.validate import across_fields, bounded

SCHEMA = 1
MAX_MANIFEST_BYTES = 1 << 20
MAX_MODULES = 256
MAX_FIRMWARE = 4096
MAX_AFTER = 256
MAX_TOKEN = 128
_SHA256 = re.compile(r"[0-9a-f]{64}\Z")
_TOKEN = re.compile(rf"[A-Za-z0-9][A-Za-z0-9._+~:-]{{0,{MAX_TOKEN - 1}}}\Z")
E = TypeVar("E", "ModuleEntry", "FirmwareEntry")


class MemoryPolicy(StrEnum):
    """Values of ``/sys/devices/system/memory/auto_online_blocks``."""

    OFFLINE = "offline"
    ONLINE = "online"
    ONLINE_KERNEL = "online_kernel"
    ONLINE_MOVABLE = "online_movable"


def _sha256_problem(digest: str) -> str | None:
    return None if _SHA256.match(digest) else "must be 64 lowercase hexadecimal digits"


def _module_file_problem(file: str) -> str | None:
    if why := relpath_problem(file):
        return why
    if not file.endswith(MODULE_SUFFIXES):
        return f"{file!r} does not end in {', '.join(MODULE_SUFFIXES)}"
    return None


def _firmware_file_problem(file: str) -> str | None:
    if why := relpath_problem(file):
        return why
    return None if file.startswith("firmware/") else f"{file!r} is not under 'firmware/'"


def _params_problem(params: str) -> str | None:
    try:
        parse_params(params)
    except ParamsError as exc:
        return f"not a kernel parameter string: {exc}"
    return None


@dataclass(frozen=True)
class ModuleEntry:
    """One module, loaded in array order with ``params``."""

    file: str = field(metadata=spec(check=_module_file_problem))
    sha256: str = field(metadata=spec(check=_sha256_problem))
    params: str = field(default="", metadata=spec(check=_params_problem))

    @property
    def name(self) -> str:
        """The module's name as the kernel spells it (from the file name)."""
        return module_name(self.file)


@dataclass(frozen=True)
class FirmwareEntry:
    """One firmware file; its path below ``firmware/`` is what the module requests."""

    file: str = field(metadata=spec(check=_firmware_file_problem))
    sha256: str = field(metadata=spec(check=_sha256_problem))


@dataclass(frozen=True)
class MemoryTable:
    """The ``[memory]`` table: the policy for hot-added memory blocks."""

    auto_online_blocks: MemoryPolicy


def token_problem(text: str) -> str | None:
    """Why ``text`` is not a plain token (a version, a kernel release), or None."""
    if _TOKEN.match(text):
        return None
    return (
        f"{text!r} is not a plain token (letters, digits, '.', '_', '+', '~', ':', '-'; "
        f"at most {MAX_TOKEN})"
    )


def _entries(entry: type[E], limit: int) -> Loader:
    """The loader of an array of ``entry`` tables: at most ``limit``, counted before any is read."""

    def load_entries(value: Any, at: str, problems: Problems) -> tuple[E, ...]:
        if not isinstance(value, list):
            problems.append(f"{at}: must be an array of tables, not {kind(value)}")
            return ()
        if len(value) > limit:
            problems.append(f"{at}: more than {limit} entries")
            return ()
        out = []
        for i, table in enumerate(value):
            try:
                out.append(load(entry, table, f"{at}[{i}]"))
            except RecordError as exc:
                problems += exc.problems
        return tuple(out)

    return load_entries


def _load_after(value: Any, at: str, problems: Problems) -> tuple[str, ...]:
    """``after``: distinct bundle names, at most :data:`MAX_AFTER`."""
    if not isinstance(value, list):
        problems.append(f"{at}: must be an array, not {kind(value)}")
        return ()
    if len(value) > MAX_AFTER:
        problems.append(f"{at}: {len(value)} entries, more than {MAX_AFTER}")
        return ()
    out: list[str] = []
    for i, name in enumerate(value):
        key = f"{at}[{i}]"
        if not isinstance(name, str):
            problems.append(f"{key}: must be a string, not {kind(name)}")
        elif why := bundle_problem(name):
            problems.append(f"{key}: {why}")
        elif name in out:
            problems.append(f"{key}: {name!r} is listed twice")
        else:
            out.append(name)
    return tuple(out)


def _load_memory(value: Any, at: str, problems: Problems) -> MemoryPolicy | None:
    """``[memory]``: its one key, ``auto_online_blocks``."""
    try:
        return load(MemoryTable, value, at).auto_online_blocks
    except RecordError as exc:
        problems += exc.problems
        return None


def _schema_problems(data: dict[str, Any], source: str) -> list[str]:
    """``schema``: missing or not an integer is a problem among the others; a number this
    reader does not know raises at once (a newer writer: its other keys mean nothing here)."""
    if "schema" not in data:
        return ["schema: missing"]
    schema = data["schema"]
    if not isinstance(schema, int) or isinstance(schema, bool):
        return [f"schema: must be {describe(int)}, not {kind(schema)}"]
    if schema != SCHEMA:
        why = f"schema: unknown schema {schema} (this modstage reads schema {SCHEMA})"
        raise ManifestError(bounded([why]), source)
    return []


def _no_modules(modules: tuple[ModuleEntry, ...]) -> str | None:
    return None if modules else "empty (a bundle loads at least one module)"


@dataclass(frozen=True)
class Manifest:
    """A bundle's manifest: what to load, in which order, with which firmware.

    Each field's checks sit beside it (``stager.schema.record``); the checks across fields
    (a file listed twice, a bundle after itself) are :mod:`stager.schema.validate`'s.
    """

    bundle: str = field(metadata=spec(check=bundle_problem))
    version: str = field(metadata=spec(check=token_problem))
    kernel: str = field(metadata=spec(check=token_problem))
    modules: tuple[ModuleEntry, ...] = field(
        metadata=spec(
            key="module",
            load=_entries(ModuleEntry, MAX_MODULES),
            check=_no_modules,
            required="a bundle loads at least one module",
        )
    )
    firmware: tuple[FirmwareEntry, ...] = field(
        default=(), metadata=spec(load=_entries(FirmwareEntry, MAX_FIRMWARE))
    )
    after: tuple[str, ...] = field(default=(), metadata=spec(load=_load_after))
    memory: MemoryPolicy | None = field(default=None, metadata=spec(load=_load_memory))

    @classmethod
    def from_toml(cls, text: str | bytes, source: str = "manifest.toml") -> Manifest:
        """Parse and validate; raises :class:`ManifestError` listing every problem."""
        if isinstance(text, bytes):
            if len(text) > MAX_MANIFEST_BYTES:
                raise ManifestError([f"larger than {MAX_MANIFEST_BYTES} bytes"], source)
            try:
                text = text.decode("utf-8")
            except UnicodeDecodeError as exc:
                raise ManifestError(
                    [f"not UTF-8 ({exc.reason} at byte {exc.start})"], source
                ) from exc
        if len(text) > MAX_MANIFEST_BYTES:
            raise ManifestError([f"larger than {MAX_MANIFEST_BYTES} bytes"], source)
        try:
            data = tomllib.loads(text)
        except (tomllib.TOMLDecodeError, RecursionError) as exc:
            raise ManifestError([f"not valid TOML: {exc}"], source) from exc
        return cls.from_dict(data, source)

    @classmethod
    def read(cls, directory: Path, source: str | None = None) -> Manifest:
        """The manifest of a drop or a stored generation: ``directory/manifest.toml``.

        For directories the reader trusts (its own drop, the store); intake reads a
        container's drop through ``service.dropfs`` instead. Raises ``OSError``
        or :class:`ManifestError` (``source`` defaults to the file's path).
        """
        path = directory / MANIFEST_NAME
        with open(path, "rb") as f:
            raw = f.read(MAX_MANIFEST_BYTES + 1)
        return cls.from_toml(raw, source or str(path))

    @classmethod
    def from_dict(cls, data: dict[str, Any], source: str = "manifest.toml") -> Manifest:
        """Validate a parsed manifest table; raises :class:`ManifestError` listing every problem.

        The fields are read with the checks declared beside them, the checks across
        fields are :mod:`stager.schema.validate`'s. The canonical form is bounded too: it is what
        the store keeps and boot reads back.
        """
        problems = _schema_problems(data, source)
        fields = {key: value for key, value in data.items() if key != "schema"}
        manifest = None
        try:
            manifest = load(cls, fields)
        except RecordError as exc:
            problems += exc.problems
        problems += across_fields(fields)
        if problems or manifest is None:
            raise ManifestError(bounded(problems), source)
        canonical = len(manifest.to_toml())
        if canonical > MAX_MANIFEST_BYTES:
            why = f"manifest: canonical form is {canonical} bytes, over {MAX_MANIFEST_BYTES}"
            raise ManifestError([why], source)
        return manifest

    def to_dict(self) -> dict[str, Any]:
        """The manifest as a TOML-ready table, keys in canonical order."""
        out: dict[str, Any] = {
            "schema": SCHEMA,
            "bundle": self.bundle,
            "version": self.version,
            "kernel": self.kernel,
            "after": list(self.after),
        }
        if self.memory is not None:
            out["memory"] = {"auto_online_blocks": self.memory.value}
        out["module"] = [dump(m) for m in self.modules]
        if self.firmware:
            out["firmware"] = [dump(f) for f in self.firmware]
        return out

    def to_toml(self) -> bytes:
        """The canonical byte form (UTF-8 TOML): equal manifests give equal bytes."""
        return tomli_w.dumps(self.to_dict()).encode()

    @property
    def digest(self) -> str:
        """sha256 of the canonical form: the id of the generation this manifest becomes."""
        return hashlib.sha256(self.to_toml()).hexdigest()

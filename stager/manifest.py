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
from typing import Any

import tomli_w

from stager.errors import ManifestError
from stager.params import ParamsError, parse_params
from stager.paths import MANIFEST_NAME, MODULE_SUFFIXES, module_name, relpath_problem
from stager.record import dump, spec

SCHEMA = 1
MAX_MANIFEST_BYTES = 1 << 20
_SHA256 = re.compile(r"[0-9a-f]{64}\Z")


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
class Manifest:
    """A bundle's manifest: what to load, in which order, with which firmware."""

    bundle: str
    version: str
    kernel: str
    modules: tuple[ModuleEntry, ...]
    firmware: tuple[FirmwareEntry, ...] = ()
    after: tuple[str, ...] = ()
    memory: MemoryPolicy | None = None

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
        container's drop through ``service.store.dropfs`` instead. Raises ``OSError``
        or :class:`ManifestError` (``source`` defaults to the file's path).
        """
        path = directory / MANIFEST_NAME
        with open(path, "rb") as f:
            raw = f.read(MAX_MANIFEST_BYTES + 1)
        return cls.from_toml(raw, source or str(path))

    @classmethod
    def from_dict(cls, data: dict[str, Any], source: str = "manifest.toml") -> Manifest:
        """Validate a parsed manifest table; raises :class:`ManifestError`."""
        from stager.validate import validate  # the checks live beside their messages

        return validate(data, source)

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

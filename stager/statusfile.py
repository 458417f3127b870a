"""``status/<bundle>.json``: the one type both sides of the status file use.

The host writes it (``service.store.statusfile`` and the copies ``service.store.publish``
mirrors for a pod); ``modstage wait`` in the container and ``modstage status`` on the
host read it. It lives in the stager because the container side imports nothing of the
host's (standard library only).

The host and the container may run different modstage versions, so the reader is
lenient about what it does not know and strict about what it does: unknown keys are
ignored, a missing key takes its default (``bundle`` and ``phase`` excepted), and a
known key of the wrong type is a :class:`StatusFileError` naming the file and the key.
:meth:`StatusFile.to_json` gives back exactly the JSON the host always wrote: the
optional keys appear only when set.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from stager.errors import StagerError

REJECTED = "rejected"  # the phases ``wait`` acts on (the host's ``Phase`` values)
FAILED = "failed"


class StatusFileError(StagerError, ValueError):
    """The status file ``path`` is unreadable or breaks its schema; ``reason`` says how."""

    def __init__(self, path: object, reason: str) -> None:
        self.path = str(path)
        self.reason = reason
        super().__init__(f"{self.path}: {reason}")


@dataclass(frozen=True)
class GenerationInfo:
    """What a pod's copy of the status file says of one generation (``generations``)."""

    version: str
    kernel: str
    failed: str | None = None


@dataclass(frozen=True)
class StatusFile:
    """One bundle's status: its phase, generations, and what the host's last step found.

    ``drop`` (on a rejection), ``version`` and ``kernel`` (on intake), ``reboot`` (the
    daemon's recorded request) and ``generations`` (in copies for a pod) are optional:
    None means the key is absent from the file.
    """

    bundle: str
    phase: str
    generation: str | None = None
    active: str | None = None
    pending: str | None = None
    failed: Mapping[str, str] = field(default_factory=dict)
    errors: tuple[str, ...] = ()
    updated: float = 0.0
    pending_kernel: str | None = None
    running_kernel: str | None = None
    drop: str | None = None
    version: str | None = None
    kernel: str | None = None
    reboot: Mapping[str, Any] | None = None
    generations: Mapping[str, GenerationInfo] | None = None

    def known(self) -> set[str]:
        """Every generation id this status names."""
        ids = {self.generation, self.active, self.pending, *self.failed}
        return {i for i in ids if i}

    def to_dict(self) -> dict[str, Any]:
        """The JSON object, keys as the host writes them (optional ones only when set)."""
        doc: dict[str, Any] = {
            "bundle": self.bundle,
            "phase": self.phase,
            "generation": self.generation,
            "active": self.active,
            "pending": self.pending,
            "failed": dict(self.failed),
            "errors": list(self.errors),
            "updated": self.updated,
            "pending_kernel": self.pending_kernel,
            "running_kernel": self.running_kernel,
        }
        for key in ("drop", "version", "kernel"):
            if getattr(self, key) is not None:
                doc[key] = getattr(self, key)
        if self.reboot is not None:
            doc["reboot"] = dict(self.reboot)
        if self.generations is not None:
            doc["generations"] = {
                g: {"version": i.version, "kernel": i.kernel, "failed": i.failed}
                for g, i in self.generations.items()
            }
        return doc

    def to_json(self) -> bytes:
        """The file's bytes (sorted keys, one-space indent, a final newline)."""
        return json.dumps(self.to_dict(), indent=1, sort_keys=True).encode() + b"\n"

    @classmethod
    def from_dict(cls, doc: Any, source: object = "status file") -> StatusFile:
        """Validate a parsed JSON object; raises :class:`StatusFileError` naming ``source``."""
        if not isinstance(doc, dict):
            raise StatusFileError(source, "status file is not a JSON object")
        get = _Getter(doc, str(source))
        return cls(
            bundle=get("bundle", _str, required=True),
            phase=get("phase", _str, required=True),
            generation=get("generation", _opt_str),
            active=get("active", _opt_str),
            pending=get("pending", _opt_str),
            failed=get("failed", _str_map, default={}),
            errors=tuple(get("errors", _str_list, default=[])),
            updated=get("updated", _number, default=0.0),
            pending_kernel=get("pending_kernel", _opt_str),
            running_kernel=get("running_kernel", _opt_str),
            drop=get("drop", _opt_str),
            version=get("version", _opt_str),
            kernel=get("kernel", _opt_str),
            reboot=get("reboot", _opt_object),
            generations=get("generations", _generations),
        )

    @classmethod
    def from_json(cls, raw: bytes, source: object = "status file") -> StatusFile:
        """Parse the file's bytes; raises :class:`StatusFileError` naming ``source``."""
        try:
            doc = json.loads(raw)
        except (ValueError, RecursionError) as exc:
            raise StatusFileError(source, f"unreadable status file: {exc}") from exc
        return cls.from_dict(doc, source)

    @classmethod
    def read(cls, path: Path) -> StatusFile | None:
        """The status file at ``path``, None if absent; :class:`StatusFileError` if bad."""
        try:
            raw = path.read_bytes()
        except FileNotFoundError:
            return None
        except OSError as exc:
            raise StatusFileError(path, f"unreadable status file: {exc}") from exc
        return cls.from_json(raw, path)


class _Getter:
    """Reads one key of a status document, checked by a converter that raises TypeError."""

    def __init__(self, doc: Mapping[str, Any], source: str) -> None:
        self.doc, self.source = doc, source

    def __call__(
        self,
        key: str,
        convert: Callable[[Any], Any],
        *,
        required: bool = False,
        default: Any = None,
    ) -> Any:
        if key not in self.doc:
            if required:
                raise StatusFileError(self.source, f"status file has no {key!r}")
            return default
        try:
            return convert(self.doc[key])
        except TypeError as exc:
            raise StatusFileError(self.source, f"status file's {key!r} {exc}") from None


def _is(value: Any, kind: type | tuple[type, ...], what: str) -> Any:
    if not isinstance(value, kind) or (isinstance(value, bool) and kind is not bool):
        raise TypeError(f"is {type(value).__name__}, not {what}")
    return value


def _str(value: Any) -> str:
    return str(_is(value, str, "a string"))


def _opt_str(value: Any) -> str | None:
    return None if value is None else str(_is(value, str, "a string or null"))


def _number(value: Any) -> float:
    return float(_is(value, (int, float), "a number"))


def _str_list(value: Any) -> list[str]:
    items = _is(value, list, "a list of strings")
    return [_is(v, str, "a list of strings") for v in items]


def _str_map(value: Any) -> dict[str, str]:
    items = _is(value, dict, "an object of strings")
    return {k: _is(v, str, "an object of strings") for k, v in items.items()}


def _opt_object(value: Any) -> dict[str, Any] | None:
    return None if value is None else dict(_is(value, dict, "an object or null"))


def _generations(value: Any) -> dict[str, GenerationInfo] | None:
    if value is None:
        return None
    what = "an object of {version, kernel, failed}"
    out = {}
    for gen, info in _is(value, dict, what).items():
        info = _is(info, dict, what)
        out[gen] = GenerationInfo(
            version=_is(info.get("version"), str, what),
            kernel=_is(info.get("kernel"), str, what),
            failed=_opt_str(info.get("failed")),
        )
    return out

"""``status/<bundle>.json``: the one type both sides of the status file use.

The host writes it (``service.publish.bundle_status`` and the copies ``service.publish.operator``
mirrors for a pod); ``modstage wait`` in the container and ``modstage status`` on the
host read it. It lives in the stager because the container side imports nothing of the
host's (standard library only).

The host and the container may run different modstage versions, so the reader is
lenient about what it does not know and strict about what it does: unknown keys are
ignored, a missing key takes its default (``bundle`` and ``phase`` excepted), and a
known key of the wrong type is a :class:`StatusFileError` naming the file and the key
(:func:`stager.schema.record.load`).
:meth:`StatusFile.to_json` gives back exactly the JSON the host always wrote: the
optional keys appear only when set.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from stager.schema.failures import StagerError
from stager.schema.record import RecordError, dump, is_empty, is_none, load, spec

REJECTED = "rejected"  # the phases ``wait`` acts on (the host's ``Phase`` values)
FAILED = "failed"
NO_DEVICE = "no_device"
OTHER_KERNEL = "other_kernel"  # no generation for the running kernel: nothing loaded


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


_ABSENT_IF_NONE = spec(omit=is_none)


@dataclass(frozen=True)
class StatusFile:
    """One bundle's status: its phase, generations, and what the host's last step found.

    ``held`` is true while an admin holds the bundle (a drop then waits in incoming, named
    by ``drop``). ``rejected`` names the bundle's last refused drops (drop name -> the first
    reason), kept by every later write, so ``wait --drop`` tells a refused drop after the
    host moved on (a reboot, another drop); absent when there is none. ``taken`` names the
    drops intake took in (drop name -> generation), kept alike; absent (None) from a host
    that does not record them, so ``wait`` then falls back to the generation the file
    names. ``boot_id`` is the boot the file was written in and ``live`` whether every module
    the active generation loaded was live then: ``wait`` calls a generation active only when
    both hold in its own boot. ``drop`` (on a
    rejection or a hold), ``version`` and ``kernel`` (on intake), ``reboot`` (the daemon's
    recorded request) and ``generations`` (in copies for a pod) are optional: None
    (``held``: false) means the key is absent from the file.
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
    drop: str | None = field(default=None, metadata=_ABSENT_IF_NONE)
    version: str | None = field(default=None, metadata=_ABSENT_IF_NONE)
    kernel: str | None = field(default=None, metadata=_ABSENT_IF_NONE)
    reboot: Mapping[str, Any] | None = field(default=None, metadata=_ABSENT_IF_NONE)
    generations: Mapping[str, GenerationInfo] | None = field(default=None, metadata=_ABSENT_IF_NONE)
    held: bool = field(default=False, metadata=spec(omit=is_empty))
    rejected: Mapping[str, str] = field(default_factory=dict, metadata=spec(omit=is_empty))
    taken: Mapping[str, str] | None = field(default=None, metadata=_ABSENT_IF_NONE)
    boot_id: str | None = field(default=None, metadata=_ABSENT_IF_NONE)
    live: bool | None = field(default=None, metadata=_ABSENT_IF_NONE)

    def known(self) -> set[str]:
        """Every generation id this status names."""
        ids = {self.generation, self.active, self.pending, *self.failed}
        return {i for i in ids if i}

    def to_dict(self) -> dict[str, Any]:
        """The JSON object, keys as the host writes them (optional ones only when set)."""
        return dump(self)

    def to_json(self) -> bytes:
        """The file's bytes (sorted keys, one-space indent, a final newline)."""
        return json.dumps(self.to_dict(), indent=1, sort_keys=True).encode() + b"\n"

    @classmethod
    def from_dict(cls, doc: Any, source: object = "status file") -> StatusFile:
        """Validate a parsed JSON object; raises :class:`StatusFileError` naming ``source``."""
        if not isinstance(doc, dict):
            raise StatusFileError(source, "status file is not a JSON object")
        try:
            return load(cls, doc, unknown="ignore")
        except RecordError as exc:
            raise StatusFileError(source, f"status file breaks its schema: {exc}") from None

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

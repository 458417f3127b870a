"""The typed records ``state.json`` keeps beside the phase machine, validated where read.

Each record is a frozen dataclass with a ``to_json`` (the persisted form, unchanged
from the untyped dicts it replaces) and a ``from_json`` that refuses anything
unexpected with a :class:`~service.errors.StateError` naming the field, so a
hand-edited or damaged file fails where it is read, never later with a KeyError.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from service.errors import StateError


def want(value: Any, kind: Any, what: str) -> Any:
    """``value`` if it is a ``kind`` (a bool is not a number here); raises StateError."""
    if not isinstance(value, kind) or (isinstance(value, bool) and bool not in _types(kind)):
        raise StateError(f"state file is corrupt: {what} is {type(value).__name__}")
    return value


def _types(kind: Any) -> tuple[type, ...]:
    return tuple(getattr(kind, "__args__", (kind,)))


def _table(value: Any, keys: set[str], where: str) -> dict[str, Any]:
    """``value`` as a JSON object with no key outside ``keys``."""
    doc: dict[str, Any] = want(value, dict, where)
    unknown = sorted(set(doc) - keys)
    if unknown:
        raise StateError(f"state file is corrupt: {where} has unknown keys {unknown}")
    return doc


@dataclass(frozen=True)
class HistoryEntry:
    """One recorded move of a bundle, or an admin's act (``source`` is ``target``)."""

    at: float
    source: str  # the phase moved from (a Phase value)
    target: str  # the phase moved to
    note: str = ""

    def to_json(self) -> dict[str, Any]:
        """The persisted form: ``at``, ``from``, ``to`` and, when there is one, ``note``."""
        doc: dict[str, Any] = {"at": self.at, "from": self.source, "to": self.target}
        if self.note:
            doc["note"] = self.note
        return doc

    @classmethod
    def from_json(cls, value: Any, where: str) -> HistoryEntry:
        """Parse one history entry; raises StateError naming ``where``."""
        doc = _table(value, {"at", "from", "to", "note"}, where)
        return cls(
            at=float(want(doc.get("at"), int | float, f"{where}.at")),
            source=want(doc.get("from"), str, f"{where}.from"),
            target=want(doc.get("to"), str, f"{where}.to"),
            note=want(doc.get("note", ""), str, f"{where}.note"),
        )


@dataclass(frozen=True)
class ModuleLoad:
    """What boot did with one module of a generation it brought up."""

    module: str  # the kernel's (normalized) module name
    srcversion: str | None
    ms: float | None = None  # how long finit_module took (None when already loaded)
    already_loaded: bool = False  # the same build was live already: not loaded again

    def to_json(self) -> dict[str, Any]:
        """The persisted form (``ms`` for a load, ``already_loaded`` for a module found live)."""
        doc: dict[str, Any] = {"module": self.module, "srcversion": self.srcversion}
        if self.already_loaded:
            doc["already_loaded"] = True
        else:
            doc["ms"] = self.ms
        return doc

    @classmethod
    def from_json(cls, value: Any, where: str) -> ModuleLoad:
        """Parse one ``loaded`` entry; raises StateError naming ``where``."""
        doc = _table(value, {"module", "srcversion", "ms", "already_loaded"}, where)
        ms = want(doc.get("ms"), int | float | None, f"{where}.ms")
        return cls(
            module=want(doc.get("module"), str, f"{where}.module"),
            srcversion=want(doc.get("srcversion"), str | None, f"{where}.srcversion"),
            ms=None if ms is None else float(ms),
            already_loaded=want(doc.get("already_loaded", False), bool, f"{where}.already_loaded"),
        )


@dataclass(frozen=True)
class RebootIntent:
    """The daemon's recorded request for a reboot: when, in which boot, how, for whom."""

    at: float  # wall time of the request
    boot_id: str | None  # the boot it was asked in (a later boot id: it happened)
    backend: str | None = None
    bundles: tuple[str, ...] = ()
    reason: str | None = None

    def to_json(self) -> dict[str, Any]:
        """The persisted form (and what status files and ``status --json`` show)."""
        return {
            "at": self.at,
            "boot_id": self.boot_id,
            "backend": self.backend,
            "bundles": list(self.bundles),
            "reason": self.reason,
        }

    @classmethod
    def from_json(cls, value: Any, where: str = "reboot") -> RebootIntent:
        """Parse the recorded intent; raises StateError naming the missing or wrong field."""
        doc = _table(value, {"at", "boot_id", "backend", "bundles", "reason"}, where)
        bundles = want(doc.get("bundles", []), list, f"{where}.bundles")
        return cls(
            at=float(want(doc.get("at"), int | float, f"{where}.at")),
            boot_id=want(doc.get("boot_id"), str | None, f"{where}.boot_id"),
            backend=want(doc.get("backend"), str | None, f"{where}.backend"),
            bundles=tuple(want(b, str, f"{where}.bundles[]") for b in bundles),
            reason=want(doc.get("reason"), str | None, f"{where}.reason"),
        )

"""Per-bundle state: the phase machine and its one persisted file, ``state.json``.

::

    (new) -> pending -> reboot_scheduled -> loading -> active
                \\_______________________________/  \\-> failed -> loading (last known good)

``verifying`` and ``rejected`` are transient phases of an intake: they are shown
in the bundle's status file but never recorded here, so a rejected drop leaves
``state.json`` untouched. Every change goes through :meth:`State.save`, i.e.
the one crash-safe write; an unreadable file is moved aside, never reset.
"""

from __future__ import annotations

import fcntl
import json
import os
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field, replace
from enum import StrEnum
from pathlib import Path
from typing import Any

from service import faults
from service.errors import StateCorrupt, StateError
from stager.atomic import fsync_dir, write_atomic

FORMAT = 1
HISTORY_LIMIT = 64
LAST_GOOD = "last-good.json"  # beside state.json: each bundle's last known good generation


class Phase(StrEnum):
    """Where a bundle's newest generation stands."""

    NONE = "none"
    VERIFYING = "verifying"
    REJECTED = "rejected"
    PENDING = "pending"
    REBOOT_SCHEDULED = "reboot_scheduled"
    LOADING = "loading"
    ACTIVE = "active"
    FAILED = "failed"


TRANSITIONS: dict[Phase, frozenset[Phase]] = {
    # intake records a verified generation as pending (a newer one replaces it)
    Phase.NONE: frozenset({Phase.PENDING}),
    Phase.PENDING: frozenset({Phase.PENDING, Phase.REBOOT_SCHEDULED, Phase.LOADING}),
    # the daemon recorded its intent to reboot; a newer drop makes it pending again
    Phase.REBOOT_SCHEDULED: frozenset({Phase.PENDING, Phase.LOADING}),
    # boot: loading again after a crash mid-load, then active or failed
    Phase.LOADING: frozenset({Phase.LOADING, Phase.ACTIVE, Phase.FAILED}),
    Phase.ACTIVE: frozenset({Phase.PENDING, Phase.LOADING}),
    Phase.FAILED: frozenset({Phase.PENDING, Phase.LOADING}),
    # status-file phases of an intake in progress or refused: never recorded in state.json
    Phase.VERIFYING: frozenset(),
    Phase.REJECTED: frozenset(),
}


def next_phase(current: Phase, target: Phase) -> Phase:
    """``target`` if the machine allows moving there from ``current``; raises otherwise."""
    if target not in TRANSITIONS[current]:
        raise StateError(f"illegal transition {current.value} -> {target.value}")
    return target


@dataclass(frozen=True)
class Generation:
    """What state remembers of one generation of a bundle."""

    id: str
    version: str
    kernel: str
    added: float = 0.0
    attempts: int = 0
    failed: str | None = None


@dataclass(frozen=True)
class BundleState:
    """One bundle: its generations, what is active and pending, and how it got there."""

    phase: Phase = Phase.NONE
    active: str | None = None
    pending: str | None = None
    generations: dict[str, Generation] = field(default_factory=dict)
    loaded: tuple[dict[str, Any], ...] = ()
    history: tuple[dict[str, Any], ...] = ()
    held: bool = False  # an admin's hold: no new generation, no reboot asked

    @property
    def last_known_good(self) -> str | None:
        """The generation that last came up (the boot falls back to it)."""
        return self.active

    def move(self, target: Phase, note: str = "", **changes: Any) -> BundleState:
        """A copy in phase ``target`` with ``changes``, the move appended to history."""
        phase = next_phase(self.phase, target)
        entry = {"at": round(time.time(), 3), "from": self.phase.value, "to": phase.value}
        if note:
            entry["note"] = note
        history = (*self.history, entry)[-HISTORY_LIMIT:]
        return replace(self, phase=phase, history=history, **changes)

    def with_generation(self, gen: Generation) -> BundleState:
        """A copy that knows ``gen`` (replacing what it knew of that id)."""
        return replace(self, generations={**self.generations, gen.id: gen})

    def keep(self) -> set[str]:
        """Generation ids the store must never collect for this bundle."""
        return {g for g in (self.active, self.pending) if g}

    def record(self, note: str) -> BundleState:
        """A copy with ``note`` appended to history, the phase unchanged (an admin's act)."""
        entry = {"at": round(time.time(), 3), "from": self.phase.value, "to": self.phase.value}
        entry["note"] = note
        return replace(self, history=(*self.history, entry)[-HISTORY_LIMIT:])

    def resolve(self, generation: str) -> Generation:
        """The known generation whose id is or starts with ``generation``; raises StateError."""
        found = [g for g in self.generations.values() if g.id.startswith(generation.lower())]
        if len(found) != 1 or not generation:
            known = ", ".join(sorted(g[:12] for g in self.generations)) or "none"
            what = "is ambiguous" if found else "is not a known generation"
            raise StateError(f"{generation!r} {what} (known: {known})")
        return found[0]

    def retry(self, generation: str | None = None) -> BundleState:
        """Clear a failed generation's failure and make it pending for the next boot.

        Without ``generation``: the most recently added failed one.
        """
        if generation is None:
            failed = sorted((g for g in self.generations.values() if g.failed), key=_added)
            if not failed:
                raise StateError("no failed generation to retry")
            gen = failed[-1]
        else:
            gen = self.resolve(generation)
        if not gen.failed:
            raise StateError(f"generation {gen.id[:12]} has not failed; use rollback")
        self._not_loading("retry")
        cleared = replace(gen, failed=None, attempts=0)
        return self.with_generation(cleared).move(
            Phase.PENDING, pending=gen.id, note=f"admin: retry {gen.id[:12]} ({gen.failed})"
        )

    def rollback(self, generation: str | None = None) -> BundleState:
        """Make an earlier generation the one to load at the next boot.

        Without ``generation``: the newest generation added before the active one
        that did not fail.
        """
        if generation is None:
            since = self.generations[self.active].added if self.active else float("inf")
            older = sorted(
                (
                    g
                    for g in self.generations.values()
                    if not g.failed and g.id != self.active and g.added < since
                ),
                key=_added,
            )
            if not older:
                raise StateError("no earlier generation to roll back to")
            gen = older[-1]
        else:
            gen = self.resolve(generation)
        if gen.id == self.active:
            raise StateError(f"generation {gen.id[:12]} is already active")
        if gen.failed:
            raise StateError(f"generation {gen.id[:12]} failed ({gen.failed}); use retry")
        self._not_loading("rollback")
        note = f"admin: rollback to {gen.id[:12]} ({gen.version})"
        return self.with_generation(replace(gen, attempts=0)).move(
            Phase.PENDING, pending=gen.id, note=note
        )

    def hold(self) -> BundleState:
        """Take no new generation and ask for no reboot until :meth:`release`."""
        if self.held:
            raise StateError("already held")
        return replace(self, held=True).record("admin: hold")

    def release(self) -> BundleState:
        """Undo :meth:`hold`."""
        if not self.held:
            raise StateError("not held")
        return replace(self, held=False).record("admin: release")

    def prune(self, retain: int) -> tuple[BundleState, list[str]]:
        """Forget generations beyond the newest ``retain``; never active (last known good)
        or pending. Returns the copy and the forgotten ids (the caller removes them)."""
        newest = {g.id for g in sorted(self.generations.values(), key=_added)[-retain:]}
        keep = self.keep() | (newest if retain > 0 else set())
        gone = sorted(g for g in self.generations if g not in keep)
        if not gone:
            return self, []
        left = {k: v for k, v in self.generations.items() if k in keep}
        note = "admin: prune " + ", ".join(g[:12] for g in gone)
        return replace(self, generations=left).record(note), gone

    def _not_loading(self, verb: str) -> None:
        if self.phase is Phase.LOADING:
            raise StateError(f"cannot {verb} while the bundle is being loaded")


def _added(gen: Generation) -> float:
    return gen.added


@dataclass(frozen=True)
class State:
    """Everything in ``state.json``."""

    bundles: dict[str, BundleState] = field(default_factory=dict)
    boot_id: str | None = None
    reboot: dict[str, Any] | None = None  # the recorded intent: asked at, in which boot, how

    def bundle(self, name: str) -> BundleState:
        """The state of bundle ``name`` (empty if unknown)."""
        return self.bundles.get(name, BundleState())

    def with_bundle(self, name: str, bundle: BundleState) -> State:
        """A copy with ``name`` replaced by ``bundle``."""
        return replace(self, bundles={**self.bundles, name: bundle})

    def to_json(self) -> bytes:
        """The persisted form."""
        bundles = {}
        for name, b in sorted(self.bundles.items()):
            data = asdict(b)
            data["phase"] = b.phase.value
            data["generations"] = {k: asdict(v) for k, v in sorted(b.generations.items())}
            bundles[name] = data
        doc = {"format": FORMAT, "boot_id": self.boot_id, "reboot": self.reboot, "bundles": bundles}
        return json.dumps(doc, indent=1, sort_keys=True).encode() + b"\n"

    @classmethod
    def from_json(cls, raw: bytes) -> State:
        """Parse the persisted form; raises :class:`StateError` on anything unexpected.

        Every field is type-checked here, so that a hand-edited or damaged file is
        refused on read rather than failing later, half-way through a boot.
        """
        try:
            doc = json.loads(raw)
            if not isinstance(doc, dict):
                raise StateError("state is not a JSON object")
            if doc.get("format") != FORMAT:
                raise StateError(f"unknown state format {doc.get('format')!r}")
            bundles = {
                _want(name, str, "bundle name"): _bundle(name, b)
                for name, b in _want(doc["bundles"], dict, "bundles").items()
            }
            reboot = _intent(doc.get("reboot"))
            boot_id = _want(doc["boot_id"], str | None, "boot_id")
            return cls(bundles=bundles, boot_id=boot_id, reboot=reboot)
        except (ValueError, KeyError, TypeError, AttributeError, RecursionError) as exc:
            if isinstance(exc, StateError):
                raise
            raise StateError(f"state file is corrupt: {exc!r}") from exc


def _intent(value: Any) -> dict[str, Any] | None:
    """The daemon's recorded reboot request, with the keys its readers index."""
    if value is None:
        return None
    intent: dict[str, Any] = _want(value, dict, "reboot intent")
    _want(intent.get("at"), int | float, "reboot intent's 'at'")
    _want(intent.get("boot_id"), str | None, "reboot intent's 'boot_id'")
    return intent


def _want(value: Any, kind: Any, what: str) -> Any:
    """``value`` if it is a ``kind`` (a bool is not a number here); raises StateError."""
    if not isinstance(value, kind) or (isinstance(value, bool) and bool not in _types(kind)):
        raise StateError(f"state file is corrupt: {what} is {type(value).__name__}")
    return value


def _types(kind: Any) -> tuple[type, ...]:
    return tuple(getattr(kind, "__args__", (kind,)))


def _generation(key: str, v: Any, where: str) -> Generation:
    v = _want(v, dict, where)
    if set(v) - {"id", "version", "kernel", "added", "attempts", "failed"}:
        raise StateError(f"state file is corrupt: {where} has unknown keys")
    gen = Generation(
        id=_want(v["id"], str, f"{where}.id"),
        version=_want(v["version"], str, f"{where}.version"),
        kernel=_want(v["kernel"], str, f"{where}.kernel"),
        added=float(_want(v.get("added", 0.0), int | float, f"{where}.added")),
        attempts=_want(v.get("attempts", 0), int, f"{where}.attempts"),
        failed=_want(v.get("failed"), str | None, f"{where}.failed"),
    )
    if gen.id != key or gen.attempts < 0:
        raise StateError(f"state file is corrupt: {where} is inconsistent")
    return gen


def _bundle(name: str, b: Any) -> BundleState:
    b = _want(b, dict, f"bundles.{name}")
    gens = {
        k: _generation(k, v, f"bundles.{name}.generations.{k}")
        for k, v in _want(b["generations"], dict, f"bundles.{name}.generations").items()
    }
    bundle = BundleState(
        phase=Phase(b["phase"]),
        active=_want(b["active"], str | None, f"bundles.{name}.active"),
        pending=_want(b["pending"], str | None, f"bundles.{name}.pending"),
        generations=gens,
        loaded=tuple(_want(x, dict, "loaded entry") for x in _want(b["loaded"], list, "loaded")),
        history=tuple(
            _want(x, dict, "history entry") for x in _want(b["history"], list, "history")
        ),
        held=_want(b.get("held", False), bool, f"bundles.{name}.held"),
    )
    if any(g not in gens for g in bundle.keep()):
        raise StateError(f"state file is corrupt: bundles.{name} names an unknown generation")
    return bundle


def read(path: Path) -> State:
    """Parse ``path`` without touching it (missing: empty); raises :class:`StateError`."""
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        return State()
    except (IsADirectoryError, NotADirectoryError) as exc:  # planted or mistaken: not a file
        raise StateError(f"{path}: cannot read: {exc.strerror} (not a regular file)") from exc
    return State.from_json(raw)


def load(path: Path) -> State:
    """Read ``path``; a missing file is an empty state, unless a corrupt one was set aside.

    A corrupt file is renamed to ``state.json.corrupt-<time>`` and
    :class:`StateCorrupt` is raised naming both paths. Until an admin removes the
    set-aside file, every later load raises too: modstage never silently forgets
    which generation was good.
    """
    if not path.exists():
        aside = sorted(path.parent.glob(f"{path.name}.corrupt-*"))
        if aside:
            raise StateCorrupt(
                path,
                aside[-1],
                "an earlier state file was corrupt; inspect it, restore it "
                "as state.json or remove it to start afresh",
            )
    try:
        return read(path)
    except StateError as exc:
        aside_path = path.with_name(f"{path.name}.corrupt-{time.time_ns()}")
        path.rename(aside_path)
        fsync_dir(path.parent)
        raise StateCorrupt(path, aside_path, str(exc)) from exc


def save(path: Path, state: State, *, step: str = "state") -> None:
    """Persist ``state`` with the one crash-safe write.

    ``step`` names the transition (a phase, or ``boot_id``) for the fault points
    ``state.<step>.renaming`` and ``state.<step>.saved``.
    """
    path.parent.mkdir(parents=True, exist_ok=True)
    write_atomic(
        path,
        state.to_json(),
        mode=0o600,
        before_replace=lambda: faults.hit(f"state.{step}.renaming"),
    )
    faults.hit(f"state.{step}.saved")
    _point_last_good(path.with_name(LAST_GOOD), state)


def read_last_good(path: Path) -> dict[str, dict[str, Any]]:
    """The last-good pointer file (``{bundle: {generation, version, kernel}}``); {} if unusable."""
    try:
        doc = json.loads(path.read_bytes())
    except (OSError, ValueError):
        return {}
    if not isinstance(doc, dict):
        return {}
    return {
        k: v for k, v in doc.items() if isinstance(v, dict) and isinstance(v.get("generation"), str)
    }


def _point_last_good(path: Path, state: State) -> None:
    """Keep the last-good pointer beside state (written only when it changes).

    It survives a corrupt ``state.json``: boot rebuilds from it and the store.
    Bundles without an active generation keep what the pointer said.
    """
    old = read_last_good(path)
    new = dict(old)
    for name, b in state.bundles.items():
        gen = b.generations.get(b.active) if b.active else None
        if gen is not None:
            new[name] = {"generation": gen.id, "version": gen.version, "kernel": gen.kernel}
    if new != old:
        write_atomic(path, json.dumps(new, indent=1, sort_keys=True).encode() + b"\n", mode=0o600)


@contextmanager
def locked(directory: Path) -> Iterator[None]:
    """Hold modstage's state lock (one writer of state.json at a time, across processes)."""
    directory.mkdir(parents=True, exist_ok=True)
    fd = os.open(directory / ".lock", os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)

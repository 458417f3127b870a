"""Per-bundle state: the phase machine and its one persisted file, ``state.json``.

::

    (new) -> pending -> reboot_scheduled -> loading -> active
                \\_______________________________/  \\-> failed -> loading (last known good)

Every change of a bundle is a named, pure transition of :class:`BundleState` or
:class:`State` that asserts what may precede it (:class:`IllegalTransition`
otherwise): :meth:`BundleState.staged` (intake), :meth:`State.reboot_asked` and
:meth:`State.rebooted` (the daemon), :meth:`BundleState.booting`,
:meth:`BundleState.went_live`, :meth:`BundleState.failed` and
:meth:`BundleState.expired` (boot), and the admin verbs. Callers do the effect,
take the transition, then save.

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
from service.errors import IllegalTransition, StateCorrupt, StateError
from service.store.records import HistoryEntry, ModuleLoad, RebootIntent, want
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
        raise IllegalTransition(f"-> {target.value}", current.value, "not in the phase table")
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
    loaded: tuple[ModuleLoad, ...] = ()
    history: tuple[HistoryEntry, ...] = ()
    held: bool = False  # an admin's hold: no new generation, no reboot asked

    @property
    def last_known_good(self) -> str | None:
        """The generation that last came up (the boot falls back to it)."""
        return self.active

    def move(self, target: Phase, note: str = "", **changes: Any) -> BundleState:
        """A copy in phase ``target`` with ``changes``, the move appended to history.

        The low-level step the named transitions below are made of (tests use it to
        build states); it checks only the phase table.
        """
        phase = next_phase(self.phase, target)
        entry = HistoryEntry(round(time.time(), 3), self.phase.value, phase.value, note)
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
        entry = HistoryEntry(round(time.time(), 3), self.phase.value, self.phase.value, note)
        return replace(self, history=(*self.history, entry)[-HISTORY_LIMIT:])

    def awaits_reboot(self, kernel: str) -> bool:
        """Whether a pending generation for ``kernel`` waits for a reboot (not held)."""
        gen = self.generations.get(self.pending) if self.pending else None
        return (
            gen is not None
            and not gen.failed
            and not self.held
            and gen.kernel == kernel
            and self.phase in (Phase.PENDING, Phase.REBOOT_SCHEDULED)
        )

    # -- transitions: intake, daemon, boot ------------------------------------------------

    def staged(self, gen: Generation, retain: int) -> BundleState:
        """Intake verified and published ``gen``: it is pending; generations past the
        newest ``retain`` are forgotten (the caller collects them after saving).

        Unchanged when ``gen`` is already pending or active and the bundle did not fail.
        Refused while the bundle is being loaded or held, and for a generation that failed.
        """
        if gen.id in (self.pending, self.active) and self.phase is not Phase.FAILED:
            return self
        self._refuse("staged", self.phase is Phase.LOADING, "the bundle is being loaded")
        self._refuse("staged", self.held, "the bundle is held by an admin")
        known = self.generations.get(gen.id)
        failed = known is not None and known.failed is not None
        self._refuse("staged", failed, f"generation {gen.id[:12]} already failed")
        moved = self.with_generation(gen).move(
            Phase.PENDING, pending=gen.id, note=f"generation {gen.id[:12]} pending"
        )
        newest = {g.id for g in sorted(moved.generations.values(), key=_added)[-retain:]}
        keep = moved.keep() | newest
        return replace(moved, generations={k: v for k, v in moved.generations.items() if k in keep})

    def reboot_asked(self, note: str) -> BundleState:
        """The daemon recorded its intent to reboot for the pending generation."""
        if self.phase is Phase.REBOOT_SCHEDULED:
            return self
        self._refuse("reboot_asked", self.pending is None, "no generation is pending")
        return self.move(Phase.REBOOT_SCHEDULED, note=note)

    def booting(self, generation: str) -> BundleState:
        """Boot is about to load ``generation`` (persisted before the kernel is touched);
        the pending generation counts an attempt."""
        gen = self._known("booting", generation)
        chosen = generation in self.keep()
        self._refuse("booting", not chosen, f"{generation[:12]} is neither pending nor active")
        if generation == self.pending:
            gen = replace(gen, attempts=gen.attempts + 1)
        return self.with_generation(gen).move(
            Phase.LOADING, note=f"generation {gen.id[:12]} attempt {gen.attempts}"
        )

    def went_live(self, generation: str, loads: tuple[ModuleLoad, ...]) -> BundleState:
        """Boot loaded ``generation``: it is active (the last known good), attempts reset."""
        self._refuse("went_live", self.phase is not Phase.LOADING, "nothing is being loaded")
        gen = replace(self._known("went_live", generation), attempts=0)
        return self.with_generation(gen).move(
            Phase.ACTIVE,
            active=gen.id,
            pending=None if gen.id == self.pending else self.pending,
            loaded=loads,
            note=f"generation {gen.id[:12]} active",
        )

    def failed(self, generation: str, reason: str) -> BundleState:
        """Boot could not bring ``generation`` up; a pending one is failed for good."""
        self._refuse("failed", self.phase is not Phase.LOADING, "nothing is being loaded")
        gen = self._known("failed", generation)
        if gen.id != self.pending:
            return self.move(Phase.FAILED, note=reason)
        return self.with_generation(replace(gen, failed=reason)).move(
            Phase.FAILED, pending=None, note=reason
        )

    def expired(self, reason: str) -> BundleState:
        """The pending generation ran out of boot attempts: failed, no longer pending."""
        self._refuse("expired", self.pending is None, "no generation is pending")
        gen = replace(self._known("expired", str(self.pending)), failed=reason)
        return self.with_generation(gen).move(Phase.FAILED, pending=None, note=reason)

    # -- the admin's verbs ----------------------------------------------------------------

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
        gen = self._earlier() if generation is None else self.resolve(generation)
        if gen.id == self.active:
            raise StateError(f"generation {gen.id[:12]} is already active")
        if gen.failed:
            raise StateError(f"generation {gen.id[:12]} failed ({gen.failed}); use retry")
        self._not_loading("rollback")
        note = f"admin: rollback to {gen.id[:12]} ({gen.version})"
        return self.with_generation(replace(gen, attempts=0)).move(
            Phase.PENDING, pending=gen.id, note=note
        )

    def _earlier(self) -> Generation:
        """The newest generation added before the active one that did not fail."""
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
        return older[-1]

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

    def _refuse(self, verb: str, refused: bool, reason: str) -> None:
        """Raise :class:`IllegalTransition` for ``verb`` when ``refused``."""
        if refused:
            raise IllegalTransition(verb, self.phase.value, reason)

    def _known(self, verb: str, generation: str) -> Generation:
        gen = self.generations.get(generation)
        if gen is None:
            raise IllegalTransition(verb, self.phase.value, f"unknown generation {generation[:12]}")
        return gen


def _added(gen: Generation) -> float:
    return gen.added


@dataclass(frozen=True)
class State:
    """Everything in ``state.json``."""

    bundles: dict[str, BundleState] = field(default_factory=dict)
    boot_id: str | None = None
    reboot: RebootIntent | None = None  # the recorded intent: asked at, in which boot, how

    def bundle(self, name: str) -> BundleState:
        """The state of bundle ``name`` (empty if unknown)."""
        return self.bundles.get(name, BundleState())

    def with_bundle(self, name: str, bundle: BundleState) -> State:
        """A copy with ``name`` replaced by ``bundle``."""
        return replace(self, bundles={**self.bundles, name: bundle})

    def awaiting_reboot(self, kernel: str) -> list[str]:
        """Bundles whose pending generation waits for a reboot into ``kernel``, by name."""
        return [n for n, b in sorted(self.bundles.items()) if b.awaits_reboot(kernel)]

    def intent_in(self, boot_id: str) -> RebootIntent | None:
        """The recorded reboot intent if it was asked in boot ``boot_id`` (else None)."""
        return self.reboot if self.reboot and self.reboot.boot_id == boot_id else None

    def booted(self, boot_id: str) -> State:
        """Boot runs in ``boot_id`` (recorded first: it tells a reboot from a restart)."""
        return replace(self, boot_id=boot_id)

    def reboot_asked(self, intent: RebootIntent, note: str) -> State:
        """The daemon's intent to reboot for ``intent.bundles`` (saved before asking)."""
        if not intent.bundles:
            raise IllegalTransition("reboot_asked", "-", "the intent names no bundle")
        state = self
        for name in intent.bundles:
            state = state.with_bundle(name, state.bundle(name).reboot_asked(note))
        return replace(state, reboot=intent)

    def rebooted(self, boot_id: str) -> State:
        """The reboot asked in another boot happened: the intent is cleared."""
        if self.reboot is None or self.reboot.boot_id == boot_id:
            why = "no reboot was asked" if self.reboot is None else "asked in this boot"
            raise IllegalTransition("rebooted", "-", why)
        return replace(self, reboot=None)

    def to_json(self) -> bytes:
        """The persisted form."""
        bundles = {name: _bundle_json(b) for name, b in sorted(self.bundles.items())}
        reboot = self.reboot.to_json() if self.reboot is not None else None
        doc = {"format": FORMAT, "boot_id": self.boot_id, "reboot": reboot, "bundles": bundles}
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
                want(name, str, "bundle name"): _bundle(name, b)
                for name, b in want(doc["bundles"], dict, "bundles").items()
            }
            raw_intent = doc.get("reboot")
            reboot = None if raw_intent is None else RebootIntent.from_json(raw_intent)
            boot_id = want(doc["boot_id"], str | None, "boot_id")
            return cls(bundles=bundles, boot_id=boot_id, reboot=reboot)
        except (ValueError, KeyError, TypeError, AttributeError, RecursionError) as exc:
            if isinstance(exc, StateError):
                raise
            raise StateError(f"state file is corrupt: {exc!r}") from exc


def _bundle_json(b: BundleState) -> dict[str, Any]:
    """One bundle's persisted form (the records at their JSON edge)."""
    return {
        "phase": b.phase.value,
        "active": b.active,
        "pending": b.pending,
        "generations": {k: asdict(v) for k, v in sorted(b.generations.items())},
        "loaded": [m.to_json() for m in b.loaded],
        "history": [h.to_json() for h in b.history],
        "held": b.held,
    }


def _generation(key: str, v: Any, where: str) -> Generation:
    v = want(v, dict, where)
    if set(v) - {"id", "version", "kernel", "added", "attempts", "failed"}:
        raise StateError(f"state file is corrupt: {where} has unknown keys")
    gen = Generation(
        id=want(v["id"], str, f"{where}.id"),
        version=want(v["version"], str, f"{where}.version"),
        kernel=want(v["kernel"], str, f"{where}.kernel"),
        added=float(want(v.get("added", 0.0), int | float, f"{where}.added")),
        attempts=want(v.get("attempts", 0), int, f"{where}.attempts"),
        failed=want(v.get("failed"), str | None, f"{where}.failed"),
    )
    if gen.id != key or gen.attempts < 0:
        raise StateError(f"state file is corrupt: {where} is inconsistent")
    return gen


def _bundle(name: str, b: Any) -> BundleState:
    where = f"bundles.{name}"
    b = want(b, dict, where)
    gens = {
        k: _generation(k, v, f"{where}.generations.{k}")
        for k, v in want(b["generations"], dict, f"{where}.generations").items()
    }
    loaded = want(b["loaded"], list, f"{where}.loaded")
    history = want(b["history"], list, f"{where}.history")
    bundle = BundleState(
        phase=Phase(b["phase"]),
        active=want(b["active"], str | None, f"{where}.active"),
        pending=want(b["pending"], str | None, f"{where}.pending"),
        generations=gens,
        loaded=tuple(ModuleLoad.from_json(x, f"{where}.loaded[{i}]") for i, x in enumerate(loaded)),
        history=tuple(
            HistoryEntry.from_json(x, f"{where}.history[{i}]") for i, x in enumerate(history)
        ),
        held=want(b.get("held", False), bool, f"{where}.held"),
    )
    if any(g not in gens for g in bundle.keep()):
        raise StateError(f"state file is corrupt: {where} names an unknown generation")
    return bundle


def read(path: Path) -> State:
    """Parse ``path`` without touching it (missing: empty); raises :class:`StateError`."""
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        return State()
    except (IsADirectoryError, NotADirectoryError) as exc:  # planted or mistaken: not a file
        raise StateError(f"{path}: cannot read: {exc.strerror} (not a regular file)") from exc
    try:
        return State.from_json(raw)
    except StateError as exc:
        raise StateError(f"{path}: {exc}") from exc


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
        raise StateCorrupt(path, aside_path, str(exc).removeprefix(f"{path}: ")) from exc


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

"""Per-bundle state: the records of ``state.json`` and the phase machine over them.

::

    (new) -> pending -> reboot_scheduled -> loading -> active
                \\_______________________________/  \\-> failed -> loading (last known good)

Every change of a bundle is a named, pure transition of :class:`BundleState` or
:class:`State` that asserts what may precede it (:class:`IllegalTransition`
otherwise): :meth:`BundleState.staged`, :meth:`BundleState.reloading` and
:meth:`BundleState.after_refusal` (intake), :meth:`State.reboot_asked` and
:meth:`State.rebooted` (the daemon), :meth:`BundleState.booting`,
:meth:`BundleState.went_live`, :meth:`BundleState.failed` and
:meth:`BundleState.expired` (boot). Callers do the effect, take the transition, then save.

This module is the bottom of the bundle state: the admin's verbs (:mod:`.verbs`) are
transitions built on these records, and the file (:mod:`.statefile`) parses and writes
them; both import this module, never the other way round.

``verifying`` and ``rejected`` are transient phases of an intake: they are shown
in the bundle's status file but never recorded here. A rejected drop leaves
``state.json`` untouched, unless the active generation's modules had left the kernel
before it (:meth:`BundleState.after_refusal`: that generation is pending again and the
refused drop recorded). Every change goes through :func:`service.bundles.statefile.save`,
the one crash-safe write; an unreadable file is moved aside, never reset.
"""

from __future__ import annotations

import time
from collections.abc import Collection, Container, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from service.bundles.phase import Phase, next_phase
from service.bundles.records import (
    AdminChoice,
    HistoryEntry,
    ModuleLoad,
    RebootIntent,
    RefusedDrop,
)
from service.errors import IllegalTransition
from stager.schema.record import is_none, spec

FORMAT = 1
_REQUIRED = spec(required=True)
HISTORY_LIMIT = 64


@dataclass(frozen=True)
class Generation:
    """What state remembers of one generation of a bundle."""

    id: str
    version: str
    kernel: str
    added: float = 0.0
    attempts: int = 0
    failed: str | None = None
    # the admin's rollback that moved the bundle away from this generation (its note, e.g.
    # "rollback to 1a2b3c4d5e6f (550.1)"): a drop of it is refused until ``modstage retry``
    rolled_back: str | None = field(default=None, metadata=spec(omit=is_none))


def added(gen: Generation) -> float:
    """When a generation was added (the order of "newest")."""
    return gen.added


def kernels_last(generations: Mapping[str, Generation], kernels: Collection[str]) -> set[str]:
    """For each release in ``kernels`` (the installed ones), the id of the newest generation
    built for it that neither failed nor was rolled back from by an admin: what a boot into
    it can still load (:func:`service.bundles.cover.carried`), which retention keeps. A kernel
    removed since releases its generations."""
    last: dict[str, Generation] = {}
    for g in generations.values():
        usable = not g.failed and not g.rolled_back
        if g.kernel in kernels and usable and added(g) >= added(last.get(g.kernel, g)):
            last[g.kernel] = g
    return {g.id for g in last.values()}


@dataclass(frozen=True)
class BundleState:
    """One bundle: its generations, what is active and pending, and how it got there."""

    # every key but ``held``, ``deployed`` and ``refused`` (added later) is required in
    # state.json; a
    # state saved before ``deployed`` existed gets it when read (statefile.decode)
    phase: Phase = field(default=Phase.NONE, metadata=_REQUIRED)
    active: str | None = field(default=None, metadata=_REQUIRED)
    pending: str | None = field(default=None, metadata=_REQUIRED)
    generations: dict[str, Generation] = field(default_factory=dict, metadata=_REQUIRED)
    loaded: tuple[ModuleLoad, ...] = field(default=(), metadata=_REQUIRED)
    history: tuple[HistoryEntry, ...] = field(default=(), metadata=_REQUIRED)
    held: bool = False  # an admin's hold: no new generation, no reboot asked
    # the generation last deployed here that a boot took up: a pending one that went live,
    # or one that failed or expired at boot (its driver pod is still the one deployed: the
    # boot publishes its config digest, the labels its failure; see :meth:`went_live`,
    # :meth:`digest_generation` and :meth:`deployed_failure`)
    deployed: str | None = field(default=None, metadata=spec(omit=is_none))
    # the refused drop whose driver pod is taken to be the one deployed: it unloaded the
    # active generation, which is pending again; its digest is published until a drop is
    # accepted (see :meth:`after_refusal` and :meth:`published_digest`)
    refused: RefusedDrop | None = field(default=None, metadata=spec(omit=is_none))
    # the admin's rollback or retry that made the pending generation pending; it lapses
    # when another generation is pending or none is (see :meth:`move`, :attr:`admin_choice`)
    chosen: AdminChoice | None = field(default=None, metadata=spec(omit=is_none))

    @property
    def admin_choice(self) -> AdminChoice | None:
        """The admin's rollback or retry the pending generation stands for (None: the
        pending one came from a drop, or nothing is pending)."""
        chosen = self.chosen
        return chosen if chosen is not None and chosen.generation == self.pending else None

    @property
    def active_up(self) -> bool:
        """Whether the last ``modstage boot`` brought the active generation up: it recorded
        its loads (a boot that loads nothing of it, for another kernel, no device or a
        failed load, records none). Whether those modules are still live is the status
        file's question (:mod:`service.publish.bundle_status`)."""
        return self.active is not None and bool(self.loaded)

    @property
    def last_known_good(self) -> str | None:
        """The generation that last came up (the boot falls back to it)."""
        return self.active

    def digest_generation(self, recorded: Container[str]) -> str | None:
        """The generation whose config digest is published for this bundle (the digest file
        the driver pod's init container compares before it keeps the loaded driver).

        The one deployed (:attr:`deployed`: the one that went live, or one that failed at
        boot whose driver pod is still the one deployed, so that its init container keeps
        the fallback) when a digest was recorded for it (``recorded``: the generations whose
        drop carried one); otherwise the active one, whose modules are loaded. None while
        nothing is active or deployed.
        """
        return self.deployed if self.deployed in recorded else self.active

    def published_digest(self, recorded: Mapping[str, str]) -> str | None:
        """The config digest to publish for this bundle (None: publish none).

        While a refused drop is recorded (:attr:`refused`), the digest it carried: its
        driver pod is the one deployed, and its init container keeps the reloaded last good
        generation only when the file holds exactly its own digest. Otherwise the digest
        ``recorded`` (generation id -> digest) for :meth:`digest_generation`.
        """
        if self.refused is not None:
            return self.refused.digest
        of = self.digest_generation(recorded)
        return recorded.get(of) if of else None

    def deployed_failure(self) -> Generation | None:
        """The generation deployed if it failed at boot (its failure stands until a newer
        generation comes up, or a revert brings one back), else None."""
        gen = self.generations.get(self.deployed) if self.deployed else None
        return gen if gen is not None and gen.failed else None

    def move(self, target: Phase, note: str = "", **changes: Any) -> BundleState:
        """A copy in phase ``target`` with ``changes``, the move appended to history.

        The low-level step the named transitions below are made of (tests use it to
        build states); it checks only the phase table. An admin's choice (:attr:`chosen`)
        lapses once the generation it made pending no longer is.
        """
        phase = next_phase(self.phase, target)
        entry = HistoryEntry(round(time.time(), 3), self.phase.value, phase.value, note)
        history = (*self.history, entry)[-HISTORY_LIMIT:]
        moved = replace(self, phase=phase, history=history, **changes)
        if moved.chosen is not None and moved.admin_choice is None:
            moved = replace(moved, chosen=None)
        return moved

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
            # other_kernel: a boot into another kernel passed it over; a reboot into its own
            # loads it
            and self.phase in (Phase.PENDING, Phase.REBOOT_SCHEDULED, Phase.OTHER_KERNEL)
        )

    # -- transitions: intake, daemon, boot ------------------------------------------------

    def staged(self, gen: Generation, retain: int, installed: Collection[str] = ()) -> BundleState:
        """Intake verified and published ``gen``: it is pending; generations past the
        newest ``retain`` are forgotten (the caller collects them after saving), but for
        the newest one of each ``installed`` kernel (:func:`kernels_last`).

        Unchanged when ``gen`` is already pending or active and the bundle did not fail,
        but for a refused drop recorded, which no longer stands (the accepted drop's pod is
        the one deployed now). Refused while the bundle is being loaded or held, for a
        generation that failed, and while an admin's rollback is pending (the drop waits:
        :attr:`admin_choice`). The note names an admin's pending retry it replaces and a
        pending generation for another kernel it displaces (carried for that kernel)."""
        if gen.id in (self.pending, self.active) and self.phase is not Phase.FAILED:
            return replace(self, refused=None) if self.refused else self
        self._refuse("staged", self.phase is Phase.LOADING, "the bundle is being loaded")
        self._refuse("staged", self.held, "the bundle is held by an admin")
        choice = self.admin_choice
        rollback = choice is not None and choice.verb == "rollback"
        self._refuse("staged", rollback, f"the admin's {choice and choice.what} is pending")
        known = self.generations.get(gen.id)
        failed = known is not None and known.failed is not None
        self._refuse("staged", failed, f"generation {gen.id[:12]} already failed")
        away = known is not None and known.rolled_back is not None
        self._refuse("staged", away, f"an admin rolled generation {gen.id[:12]} back")
        every = {**self.generations, gen.id: gen}
        newest = {g.id for g in sorted(every.values(), key=added)[-retain:]}
        keep = {g for g in (self.active, gen.id) if g} | newest | kernels_last(every, installed)
        gone = sorted(g[:12] for g in every if g not in keep)
        note = f"generation {gen.id[:12]} pending"
        before = self.generations.get(self.pending or "")
        if before is not None and before.kernel != gen.kernel and before.id in keep:
            note += f"; {before.id[:12]} (for kernel {before.kernel}) stays carried for its kernel"
        if self.admin_choice is not None:  # the admin's retry it replaces (a rollback waits)
            note += f"; replaces the admin's pending {self.admin_choice.what}"
        if gone:  # said where the admin looks: the pruned ones leave no other trace
            note += f"; retain {retain} forgot {', '.join(gone)}"
        moved = self.with_generation(gen).move(
            Phase.PENDING, pending=gen.id, refused=None, note=note
        )
        return replace(moved, generations={k: v for k, v in moved.generations.items() if k in keep})

    def reloading(self, generation: str, refused: RefusedDrop | None = None) -> BundleState:
        """The active ``generation`` is dropped again while its modules are no longer in the
        kernel (something unloaded them, such as a driver pod's init container): it is
        pending once more, so a reboot is asked and the next boot loads it again.

        From phase ``active``, or from ``pending``/``reboot_scheduled`` when the pending
        generation is for another kernel (a drop for the next kernel, or for an installed
        fallback one): that one is displaced but stays among the generations, carried for
        its kernel (:func:`service.bundles.cover.carried`), so a boot into that kernel still
        loads it. Refused when a generation for ``generation``'s kernel already waits for
        its reboot (:meth:`awaits_reboot`), while held, and in any other phase.

        With ``refused``, it was not dropped again: the drop that followed the unload was
        refused (:meth:`after_refusal`), and that drop is recorded as :attr:`refused`;
        without, a refused drop recorded no longer stands."""
        self._refuse("reloading", generation != self.active, f"{generation[:12]} is not active")
        self._refuse("reloading", self.held, "the bundle is held by an admin")
        waiting = (Phase.ACTIVE, Phase.PENDING, Phase.REBOOT_SCHEDULED)
        self._refuse("reloading", self.phase not in waiting, "the bundle is not active")
        kernel = self._known("reloading", generation).kernel
        why = f"a generation for {kernel} already waits for its reboot"
        self._refuse("reloading", self.awaits_reboot(kernel), why)
        why = "its modules were unloaded"
        if refused is not None:
            why += f" and the drop after them was refused ({refused.version or 'no version'})"
        displaced = self.generations.get(self.pending) if self.pending else None
        if displaced is not None:
            why += f"; generation {displaced.id[:12]} for {displaced.kernel} stays carried"
        return self.move(
            Phase.PENDING,
            pending=generation,
            refused=refused,
            note=f"generation {generation[:12]} pending again: {why}",
        )

    def after_refusal(self, refused: RefusedDrop, unloaded: bool) -> BundleState:
        """Intake refused a drop of this bundle (``refused``); ``unloaded``: the active
        generation is for the running kernel and some of the modules boot loaded for it
        have left the kernel since (the driver pod that made the drop unloaded them first).

        Then the active generation is pending again (:meth:`reloading`, ``refused``
        recorded), so a reboot brings the last good driver back, unless a generation for
        its kernel already waits for a reboot (a pending one for another kernel does not
        count: it is displaced and carried). Once per refused drop: the same drop refused
        again after its reload went live, its modules unloaded once more, changes nothing,
        so no pod can make reboots follow one another. A refused drop while the active
        generation waits to be reloaded is recorded in place of the one before (its pod is
        the newer one); no other reboot is asked. Unchanged otherwise: modules still
        loaded, nothing active, or held by an admin (no reboot asked).
        """
        if self.held or self.active is None:
            return self
        if self.refused is not None and self.refused.same_drop(refused):
            return self
        active = self.generations.get(self.active)
        waits = self.phase in (Phase.PENDING, Phase.REBOOT_SCHEDULED)
        reloads = unloaded and (self.phase is Phase.ACTIVE or waits)
        if reloads and active is not None and not self.awaits_reboot(active.kernel):
            return self.reloading(self.active, refused)
        if waits and self.pending == self.active:
            note = f"refused drop recorded ({refused.version or 'no version'}): {refused.reason}"
            return replace(self, refused=refused).record(note)
        return self

    def reboot_asked(self, note: str) -> BundleState:
        """The daemon recorded its intent to reboot for the pending generation."""
        if self.phase is Phase.REBOOT_SCHEDULED:
            return self
        self._refuse("reboot_asked", self.pending is None, "no generation is pending")
        return self.move(Phase.REBOOT_SCHEDULED, note=note)

    def booting(self, generation: str, carried: str | None = None) -> BundleState:
        """Boot is about to load ``generation`` (persisted before the kernel is touched):
        the pending or the active one, or ``carried``, the one carried for the running
        kernel (:func:`service.bundles.cover.carried`); the pending generation counts an
        attempt."""
        gen = self._known("booting", generation)
        chosen = generation in self.keep() or generation == carried
        self._refuse("booting", not chosen, f"{generation[:12]} is neither pending nor active")
        if generation == self.pending:
            gen = replace(gen, attempts=gen.attempts + 1)
        return self.with_generation(gen).move(
            Phase.LOADING, note=f"generation {gen.id[:12]} attempt {gen.attempts}"
        )

    def went_live(self, generation: str, loads: tuple[ModuleLoad, ...]) -> BundleState:
        """Boot loaded ``generation``: it is active (the last known good), attempts reset,
        and an earlier failure of it no longer stands (the kernel has just loaded it).

        A pending generation going live becomes ``deployed``. The last known good brought
        back (after a failure, or at a plain reboot) leaves a failed one ``deployed``: the
        driver pod still deployed is that one's, and its init container keeps what is loaded
        only when the published config digest is its own.
        """
        self._refuse("went_live", self.phase is not Phase.LOADING, "nothing is being loaded")
        gen = replace(self._known("went_live", generation), attempts=0, failed=None)
        kept = self.generations.get(self.deployed or "")
        deployed = self.deployed if kept and kept.failed and gen.id != self.pending else gen.id
        return self.with_generation(gen).move(
            Phase.ACTIVE,
            active=gen.id,
            pending=None if gen.id == self.pending else self.pending,
            loaded=loads,
            deployed=deployed,
            note=f"generation {gen.id[:12]} active",
        )

    def failed(self, generation: str, reason: str) -> BundleState:
        """Boot could not bring ``generation`` up (the loader unloaded what the attempt
        loaded: nothing of the bundle is loaded); a pending one is failed for good."""
        self._refuse("failed", self.phase is not Phase.LOADING, "nothing is being loaded")
        gen = self._known("failed", generation)
        if gen.id not in (self.pending, self.active):  # a carried one: not tried again
            return self.with_generation(replace(gen, failed=reason)).move(
                Phase.FAILED, loaded=(), deployed=gen.id, note=reason
            )
        if gen.id != self.pending:
            return self.move(Phase.FAILED, loaded=(), note=reason)
        return self.with_generation(replace(gen, failed=reason)).move(
            Phase.FAILED, pending=None, loaded=(), deployed=gen.id, note=reason
        )

    def no_device(self, generation: str, reason: str) -> BundleState:
        """Boot found no device for ``generation``'s modules: nothing of it is loaded, the
        attempt it counted is given back, nothing fails and a pending one stays pending
        (the next boot tries it again; no reboot is asked for it)."""
        self._refuse("no_device", self.phase is not Phase.LOADING, "nothing is being loaded")
        gen = self._known("no_device", generation)
        if gen.id == self.pending:
            gen = replace(gen, attempts=max(0, gen.attempts - 1))
        return self.with_generation(gen).move(Phase.NO_DEVICE, loaded=(), note=reason)

    def other_kernel(self, note: str) -> BundleState:
        """Boot found no generation of the bundle for the running kernel while its active
        one targets another: nothing of it is loaded. Pending and active stay as they were
        (a boot into their kernel loads them); a later boot finding the same is no new
        history entry."""
        self._refuse("other_kernel", self.phase is Phase.LOADING, "the bundle is being loaded")
        self._refuse("other_kernel", self.active is None, "nothing is active")
        if self.phase is Phase.OTHER_KERNEL:
            return replace(self, loaded=())
        return self.move(Phase.OTHER_KERNEL, loaded=(), note=note)

    def expired(self, reason: str) -> BundleState:
        """The pending generation ran out of boot attempts: failed, no longer pending."""
        self._refuse("expired", self.pending is None, "no generation is pending")
        gen = replace(self._known("expired", str(self.pending)), failed=reason)
        return self.with_generation(gen).move(
            Phase.FAILED, pending=None, deployed=gen.id, note=reason
        )

    def _refuse(self, verb: str, refused: bool, reason: str) -> None:
        """Raise :class:`IllegalTransition` for ``verb`` when ``refused``."""
        if refused:
            raise IllegalTransition(verb, self.phase.value, reason)

    def _known(self, verb: str, generation: str) -> Generation:
        gen = self.generations.get(generation)
        if gen is None:
            raise IllegalTransition(verb, self.phase.value, f"unknown generation {generation[:12]}")
        return gen


@dataclass(frozen=True)
class State:
    """Everything in ``state.json``."""

    bundles: dict[str, BundleState] = field(default_factory=dict, metadata=_REQUIRED)
    boot_id: str | None = field(default=None, metadata=_REQUIRED)
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

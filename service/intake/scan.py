"""Intake: turn complete drops into verified, published, pending generations.

For each drop: read its manifest (safely), apply the host's policy, copy the
files it names into a temporary store directory, verify the copies, ask the
running kernel whether it will trust the signers (when it enforces
signatures), publish the generation under its id and record it as pending. A
drop of a generation the store holds already is verified again from the stored
copy, under the config and certificates of now.
A drop that fails anything is rejected with its reasons in
``status/<bundle>.json`` and the log, and changes nothing else, unless the
modules of the bundle's active generation had left the kernel before it: then
that generation is pending again (:mod:`service.intake.rejection`). Either way the
drop is removed from ``incoming/`` once its outcome is recorded. A failure of
the host's own (an ``OSError`` writing the store, state or status: a full disk)
is not the drop's fault: the drop is kept for the next run, and the error shown.
A drop that cannot be judged yet waits in ``incoming/``, its status file saying why:
its bundle is held, an admin's rollback is pending (a container re-dropping the driver
the admin rolled back from would undo it), or the target kernel's module tree is not
installed (:func:`~service.intake.admit.missing_tree`).
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from service import faults
from service.bundles.phase import Phase
from service.bundles.state import BundleState, Generation, State
from service.bundles.statefile import load, locked, read, save
from service.config import Config
from service.dropfs import open_dir, read_manifest
from service.errors import DropError, ServiceError
from service.generations.store import Store
from service.host.installed import installed_releases
from service.intake.admit import (
    bundle_exports,
    missing_tree,
    policy_problems,
    verify_copy,
)
from service.intake.drops import Drops
from service.intake.memory_owner import memory_claims
from service.intake.outcome import Outcome as Outcome  # re-exported: its home before
from service.intake.owners import owners_of, record_names
from service.intake.rejection import Carried, may_keep_status, reject, unloaded
from service.layout import Layout
from service.logs import get_logger
from service.publish.bundle_status import write_status
from service.publish.operator import (
    forget_digests,
    mirror_status,
    read_digest,
    record_digest,
)
from service.verify.compressed.budget import per_drop
from service.verify.modfile.symtab import Export
from service.verify.signature.keyring import Keyring
from service.verify.signature.trust import TrustStore
from stager.schema.failures import ManifestError
from stager.schema.manifest import Manifest
from stager.schema.paths import parse_drop_name
from stager.schema.shown import MAX_REASON, shown

log = get_logger("modstage.intake")
GONE = "gone: taken in or removed meanwhile"


class Rejected(Exception):
    """A drop is refused; ``reasons`` are shown to the container and the admin."""

    def __init__(self, reasons: list[str]) -> None:
        self.reasons = reasons
        super().__init__("; ".join(reasons))


class Misnamed(Rejected):
    """A drop whose directory names another bundle than its manifest: refused without a
    word in either bundle's status or state (whoever wrote it speaks for neither)."""


@dataclass
class Intake:
    """Everything intake needs, built once per run (the daemon keeps one)."""

    layout: Layout
    config: Config
    trust: TrustStore
    keyring: Keyring
    tick: Callable[[], None] = field(default=lambda: None)  # called during long steps
    # told the drop whose files are being copied and verified, then None (the daemon
    # rejects the drop its intake child was killed on: see service.daemon.intake_runner)
    building: Callable[[Path | None], None] = field(default=lambda drop: None)
    stuck: dict[str, str] = field(default_factory=dict)  # drops that cannot be removed

    @property
    def store(self) -> Store:
        """The generation store."""
        return Store(self.layout.store)

    @property
    def drops(self) -> Drops:
        """Finding and disposing of drops (``stuck`` drops are remembered across scans)."""
        return Drops(self.layout, self.config, self.tick, self.stuck)

    def run(self, drops: list[Path] | None = None) -> list[Outcome]:
        """Take in ``drops`` (default: every complete drop) one after the other."""
        with locked(self.layout.var):
            self._clean_store()
            try:
                outcomes = [self.take(drop) for drop in (drops or self._scan())]
                mirror_status(self.layout, self.config)
                return outcomes
            finally:
                self.drops.empty_trash()

    def _scan(self) -> list[Path]:
        """The newest complete drop of each bundle for each kernel (:meth:`Drops.complete`),
        contained: a scan that fails takes nothing, says why."""
        try:
            return self.drops.complete()
        except Exception as exc:  # the daemon never dies because of a drop
            log.error("scan.failed", incoming=str(self.layout.incoming), error=shown(exc))
            return []

    def _clean_store(self) -> None:
        """Remove what a killed intake or collection left; a failure is logged, not fatal."""
        try:
            self.store.clean_temporaries()
            self.store.clean_unpublished(_referenced(self.layout))
        except OSError as exc:
            log.error("store.clean_failed", error=shown(exc))

    def take(self, drop: Path) -> Outcome:
        """Take in one drop (the caller holds the state lock).

        Never raises, whatever the drop contains: a failure of the drop is a rejection
        (the drop goes to the quarantine), one of the host's a deferral (kept), and
        anything unforeseen a rejection naming the error. A drop that vanished before
        the lock was ours (another intake took it) is left alone, with no status.
        """
        self.tick()
        if not os.path.lexists(drop) or self.drops.skipped(drop):
            return Outcome(drop, None, None, False, (GONE,), gone=True)
        named = parse_drop_name(drop.name)
        bundle = named[0] if named else None
        started = time.monotonic()
        try:
            return self._take(drop, started)
        except OSError as exc:
            reason = f"the host could not take the drop in, it is kept for the next run: {exc}"
            log.error("drop.deferred", drop=drop.name, bundle=bundle, reason=shown(reason))
            self._status_after_host_error(bundle, shown(reason, MAX_REASON), drop)
            return Outcome(drop, bundle, None, False, (shown(reason, MAX_REASON),), deferred=True)
        except Exception as exc:  # never fatal: whatever the drop did, it is rejected
            reasons = [f"cannot be taken in: {type(exc).__name__}: {exc}"]
            return reject(self.layout, self.config, self.drops, drop, bundle, reasons)

    def _take(self, drop: Path, started: float) -> Outcome:
        """Screen, build, record: effect, transition, save (a refusal is a rejection)."""
        named = parse_drop_name(drop.name)
        bundle = named[0] if named else None
        carried: Carried | None = None  # what the drop carried, once read
        try:
            manifest = self._manifest(drop)
            bundle = manifest.bundle
            carried = Carried(manifest.version, manifest.digest, kernel=manifest.kernel)
            digest = self._digest(drop)
            carried = Carried(manifest.version, manifest.digest, digest, manifest.kernel)
            held = load(self.layout.state).bundle(bundle)
            # before any check that could refuse it: a hold never loses a drop
            if (wait := _behind_admin(bundle, held, manifest.digest)) is not None:
                return self._waits(drop, bundle, held, wait)
            state = self._screen(manifest)
            faults.hit("intake.verifying")
            if not self.store.has(manifest.digest):
                if (missing := missing_tree(self.layout, manifest.kernel)) is not None:
                    return self._waits(drop, bundle, state.bundle(bundle), missing)
                self.building(drop)
                try:
                    self._build(drop, manifest, started, state)
                finally:
                    self.building(None)
            elif missing_tree(self.layout, manifest.kernel) is None:
                self._judge_stored(drop, manifest, state)
            self._record(state, manifest, digest, drop.name)
        except Misnamed as exc:  # claims a bundle its manifest is not for: it speaks for none
            return reject(self.layout, self.config, self.drops, drop, None, exc.reasons)
        except (Rejected, DropError, ManifestError) as exc:
            reasons = exc.reasons if isinstance(exc, Rejected) else [str(exc)]
            return reject(self.layout, self.config, self.drops, drop, bundle, reasons, carried)
        seconds = time.monotonic() - started
        log.info(
            "drop.accepted",
            drop=drop.name,
            bundle=bundle,
            generation=manifest.digest,
            ms=round(seconds * 1000),
        )
        self.drops.remove(drop, "taken in")
        return Outcome(drop, bundle, manifest.digest, True, seconds=seconds)

    def _waits(self, drop: Path, name: str, bundle: BundleState, wait: tuple[str, str]) -> Outcome:
        """The drop waits in incoming, untouched, until what it waits for changes (the
        daemon's next scan, or ``modstage intake``, takes it in then); its status file and
        the log (``wait``: event, reason) say why."""
        event, reason = wait
        log.warning(event, drop=drop.name, bundle=name, reason=reason)
        write_status(self.layout, name, bundle, errors=[reason], drop=drop.name)
        return Outcome(drop, name, None, False, (reason,), deferred=True, waiting=True)

    def _screen(self, manifest: Manifest) -> State:
        """The current state, once the drop passed the host's policy; status says verifying."""
        bundle = manifest.bundle
        state = load(self.layout.state)
        if state.bundle(bundle).phase is Phase.LOADING:
            raise Rejected([f"bundle {bundle!r} is being loaded; drop it again after boot"])
        problems = policy_problems(self.config, manifest, state.bundle(bundle))
        problems += memory_claims(manifest, state, self.store)
        if problems:
            raise Rejected(problems)
        if bundle in state.bundles or may_keep_status(self.layout, self.config, bundle):
            write_status(
                self.layout,
                bundle,
                state.bundle(bundle),
                phase=Phase.VERIFYING,
                generation=manifest.digest,
            )
        return state

    def _record(self, state: State, manifest: Manifest, digest: str | None, drop: str) -> None:
        """The published generation staged as pending, saved; what fell past retain collected."""
        name, generation = manifest.bundle, manifest.digest
        before = state.bundle(name)
        gen = Generation(generation, manifest.version, manifest.kernel, added=time.time())
        if self._unloaded(before, gen):
            after = before.reloading(generation)
        else:
            after = before.staged(gen, self.config.retain, installed_releases(self.layout))
        choice = before.admin_choice
        if choice is not None and after.pending != choice.generation:
            log.warning(
                "drop.replaces_admin_choice",
                bundle=name,
                generation=generation,
                replaces=f"the admin's pending {choice.what}",
            )
        record_digest(self.layout, generation, digest)  # before state names it
        save(self.layout.state, state.with_bundle(name, after), step="pending")
        forget_digests(self.layout, state.with_bundle(name, after))
        # collected only once state no longer names them: a crash never leaves a dangling id
        self.store.collect(g for g in before.generations if g not in after.generations)
        faults.hit("store.collected")
        write_status(
            self.layout,
            name,
            after,
            generation=generation,
            version=manifest.version,
            kernel=manifest.kernel,
            taken=drop,
        )
        faults.hit("intake.recorded")

    def _unloaded(self, bundle: BundleState, gen: Generation) -> bool:
        """Whether ``gen`` is the bundle's active generation, for the running kernel, some
        of the modules boot loaded for it have left the kernel since, and no generation for
        that kernel waits for a reboot already (one pending for another kernel does not
        count: :meth:`~service.bundles.state.BundleState.reloading` displaces it)."""
        if gen.id != bundle.active or bundle.awaits_reboot(gen.kernel):
            return False
        waits = (Phase.ACTIVE, Phase.PENDING, Phase.REBOOT_SCHEDULED)
        return bundle.phase in waits and unloaded(self.layout, bundle)

    def _status_after_host_error(self, bundle: str | None, reason: str, drop: Path) -> None:
        if bundle is None:
            return
        try:
            current = load(self.layout.state).bundle(bundle)
            write_status(self.layout, bundle, current, errors=[reason], drop=drop.name)
        except OSError as exc:  # the disk that failed the intake may fail this too
            log.error("status.unwritable", bundle=bundle, error=str(exc))

    def _manifest(self, drop: Path) -> Manifest:
        manifest = read_manifest(drop, self.config.limits)
        named = parse_drop_name(drop.name)
        if named and named[0] != manifest.bundle:
            raise Misnamed(
                [
                    f"{drop}: directory is named for bundle {named[0]!r} but its "
                    f"manifest is for {manifest.bundle!r}"
                ]
            )
        return manifest

    def _digest(self, drop: Path) -> str | None:
        fd = open_dir(drop)
        try:
            return read_digest(fd, drop)
        finally:
            os.close(fd)

    def _exported_before(self, state: State, manifest: Manifest) -> dict[str, Export] | None:
        """What the bundles ``manifest`` loads after export: the generation boot would
        bring up for each (pending if any, else active), as the kernel will see them.
        None when one of them has no generation yet (its exports are unknown)."""
        out: dict[str, Export] = {}
        for name in manifest.after:
            bundle = state.bundles.get(name)
            generation = bundle and (bundle.pending or bundle.active)
            if not generation or not self.store.has(generation):
                return None
            stored = self.store.path(generation)
            out.update(bundle_exports(stored, self.store.manifest(generation)))
        return out

    def _judge_stored(self, drop: Path, manifest: Manifest, state: State) -> None:
        """Judge a drop of a generation the store holds already from the stored copy, as a
        new one is judged, by the host's config and certificates of now: a policy tightened
        since the generation was taken in refuses it here, before it is pending again."""
        with per_drop(self.config.limits.max_decompressed_bytes):
            reasons = self._verify(self.store.path(manifest.digest), manifest, drop, state)
        if reasons:
            raise Rejected(reasons)

    def _verify(
        self,
        copy: Path,
        manifest: Manifest,
        drop: Path,
        state: State,
        names: dict[str, str] | None = None,
    ) -> list[str]:
        """:func:`~service.intake.admit.verify_copy` of the drop's files at ``copy``, with
        the host's config and certificates, the bundles it loads after and the owners of
        every other bundle's names; ``names`` gets the names its modules register."""
        return verify_copy(
            copy,
            manifest,
            layout=self.layout,
            config=self.config,
            trust=self.trust,
            keyring=self.keyring,
            shown=drop,
            before=self._exported_before(state, manifest),
            owners=owners_of(state, self.store, manifest.bundle),
            names=names,
        )

    def _build(self, drop: Path, manifest: Manifest, started: float, state: State) -> None:
        """Copy the drop into the store, verify the copies, publish them under their id with
        the names its modules register (:func:`~service.intake.owners.record_names`)."""
        names: dict[str, str] = {}
        deadline = started + self.config.limits.max_seconds

        def tick() -> None:
            self.tick()
            if time.monotonic() > deadline:
                raise Rejected(
                    [f"taking the drop in took over {self.config.limits.max_seconds} s (limits)"]
                )

        fd = open_dir(drop)
        try:
            tmp = self.store.copy_drop(
                fd, manifest, display=drop, limits=self.config.limits, tick=tick
            )
        finally:
            os.close(fd)
        faults.hit("store.copied")
        try:
            tick()
            # images of compressed modules are spilled beside the copies, never in memory
            with per_drop(self.config.limits.max_decompressed_bytes, spill=tmp):
                reasons = self._verify(tmp, manifest, drop, state, names)
            if reasons:
                raise Rejected(reasons)
            record_names(tmp, names)
            tick()
            self.store.publish(tmp, manifest.digest)
        finally:
            self.store.discard(tmp)


def _behind_admin(name: str, bundle: BundleState, generation: str) -> tuple[str, str] | None:
    """Why a drop of ``generation`` must wait for an admin (log event, reason), or None:
    the bundle is held, or an admin's rollback to another generation is pending."""
    if bundle.held:
        reason = (
            f"bundle {name!r} is held by an admin: the drop waits in incoming until "
            "modstage release"
        )
        return "drop.held", reason
    choice = bundle.admin_choice
    if choice is None or choice.verb != "rollback" or choice.generation == generation:
        return None
    cancel = (
        f" or modstage rollback {name} {bundle.active[:12]} cancels it" if bundle.active else ""
    )
    reason = (
        f"bundle {name!r} has the admin's pending {choice.what}: the drop waits in "
        f"incoming until that generation is live (the next boot){cancel}"
    )
    return "drop.waits_for_rollback", reason


def _referenced(layout: Layout) -> set[str] | None:
    """Generations state.json names (None when it cannot be read: then clean nothing)."""
    try:
        state = read(layout.state)
    except (OSError, ServiceError):
        return None
    return {g for b in state.bundles.values() for g in b.generations}

"""Intake: turn complete drops into verified, published, pending generations.

For each drop: read its manifest (safely), apply the host's policy, copy the
files it names into a temporary store directory, verify the copies, ask the
running kernel whether it will trust the signers (when it enforces
signatures), publish the generation under its id and record it as pending.
A drop that fails anything is rejected with its reasons in
``status/<bundle>.json`` and the log, and changes nothing else. Either way the
drop is removed from ``incoming/`` once its outcome is recorded. A failure of
the host's own (an ``OSError`` writing the store, state or status: a full disk)
is not the drop's fault: the drop is kept for the next run, and the error shown.
"""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path

from service import faults
from service.config import Config
from service.errors import DropError, ServiceError
from service.layout import Layout
from service.logs import get_logger
from service.store import quarantine
from service.store.dropfs import open_dir, read_small, remove_tree
from service.store.generations import Store
from service.store.outcome import Outcome as Outcome  # re-exported: its home before
from service.store.publish import (
    forget_digests,
    incoming_dirs,
    mirror_status,
    read_digest,
    record_digest,
)
from service.store.state import BundleState, Generation, Phase, load, locked, read, save
from service.store.statusfile import write_status
from service.verify.bundle import order_problems
from service.verify.keyring import Keyring, enforcing
from service.verify.params import param_problems
from service.verify.target import Target
from service.verify.trust import TrustStore
from service.verify.verdict import Verdict, verify_files
from stager.errors import ManifestError
from stager.manifest import MAX_MANIFEST_BYTES, Manifest
from stager.params import parse_params
from stager.paths import MANIFEST_NAME, parse_drop_name
from stager.shown import MAX_REASON, bounded, shown

log = get_logger("modstage.intake")
GONE = "gone: taken in or removed meanwhile"
MAX_STATUS_FILES = 64  # status files a rejection may create for names state.json does not know


class _NoStatus(Exception):
    """This rejection leaves no status file (see :meth:`Intake._may_keep_status`)."""


class Rejected(Exception):
    """A drop is refused; ``reasons`` are shown to the container and the admin."""

    def __init__(self, reasons: list[str]) -> None:
        self.reasons = reasons
        super().__init__("; ".join(reasons))


@dataclass
class Intake:
    """Everything intake needs, built once per run (the daemon keeps one)."""

    layout: Layout
    config: Config
    trust: TrustStore
    keyring: Keyring
    tick: Callable[[], None] = field(default=lambda: None)  # called during long steps

    @property
    def store(self) -> Store:
        """The generation store."""
        return Store(self.layout.store)

    def complete_drops(self) -> list[Path]:
        """The newest complete drop of each bundle; older complete ones are removed.

        Drops are gathered from every configured incoming directory.
        """
        newest: dict[str, tuple[str, Path]] = {}
        entries: list[Path] = []
        for directory in incoming_dirs(self.layout, self.config):
            try:
                entries += list(directory.iterdir())
            except FileNotFoundError:
                continue
        for entry in entries:
            named = parse_drop_name(entry.name)
            if named is None or not os.path.lexists(entry / MANIFEST_NAME):
                continue
            if quarantine.left_in_place(self.layout, entry):
                continue
            bundle, key = named
            if bundle in newest and newest[bundle][0] > key:
                self._remove(entry, "superseded")
                continue
            if bundle in newest:
                self._remove(newest[bundle][1], "superseded")
            newest[bundle] = (key, entry)
        return sorted((path for _key, path in newest.values()), key=_manifest_size)

    def run(self, drops: list[Path] | None = None) -> list[Outcome]:
        """Take in ``drops`` (default: every complete drop) one after the other."""
        with locked(self.layout.var):
            self._clean_store()
            try:
                outcomes = [self.take(drop) for drop in (drops or self._scan())]
                mirror_status(self.layout, self.config)
                return outcomes
            finally:
                self.empty_trash()

    def _scan(self) -> list[Path]:
        """:meth:`complete_drops`, contained: a scan that fails takes nothing, says why."""
        try:
            return self.complete_drops()
        except Exception as exc:  # the daemon never dies because of a drop
            log.error("scan.failed", incoming=str(self.layout.incoming), error=shown(exc))
            return []

    def empty_trash(self) -> None:
        """Remove the drops renamed into the trash (after the scan: they delay no one)."""
        try:
            names = os.listdir(self.layout.trash)
        except OSError:
            return
        for name in names:
            try:
                remove_tree(
                    self.layout.trash,
                    name,
                    max_entries=self.config.limits.max_tree_entries,
                    tick=self.tick,
                )
            except OSError as exc:
                reason = f"could not be removed: {exc}"
                quarantine.put(
                    self.layout, self.layout.trash / name, None, [reason], self.config.limits
                )

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
        if not os.path.lexists(drop) or quarantine.left_in_place(self.layout, drop):
            return Outcome(
                drop, None, None, False, ("gone: taken in or removed meanwhile",), gone=True
            )
        named = parse_drop_name(drop.name)
        started = time.monotonic()
        try:
            return self._take(drop, started)
        except OSError as exc:
            reason = f"the host could not take the drop in, it is kept for the next run: {exc}"
            bundle = named[0] if named else None
            log.error("drop.deferred", drop=drop.name, bundle=bundle, reason=shown(reason))
            self._status_after_host_error(bundle, shown(reason, MAX_REASON), drop)
            return Outcome(drop, bundle, None, False, (shown(reason, MAX_REASON),), deferred=True)
        except Exception as exc:  # never fatal: whatever the drop did, it is rejected
            reasons = [f"cannot be taken in: {type(exc).__name__}: {exc}"]
            return self._reject(drop, named[0] if named else None, reasons)

    def _take(self, drop: Path, started: float) -> Outcome:
        named = parse_drop_name(drop.name)
        bundle = named[0] if named else None
        try:
            manifest = self._manifest(drop)
            bundle = manifest.bundle
            digest = self._digest(drop)
            state = load(self.layout.state)
            if state.bundle(bundle).phase is Phase.LOADING:
                raise Rejected([f"bundle {bundle!r} is being loaded; drop it again after boot"])
            self._check_policy(manifest, state.bundle(bundle))
            generation = manifest.digest
            if bundle in state.bundles or self._may_keep_status(bundle):
                write_status(
                    self.layout,
                    bundle,
                    state.bundle(bundle),
                    phase=Phase.VERIFYING,
                    generation=generation,
                )
            faults.hit("intake.verifying")
            if not self.store.has(generation):
                self._build(drop, manifest, generation, started)
            before = state.bundle(bundle)
            bstate = record_pending(before, manifest, self.config.retain)
            record_digest(self.layout, generation, digest)  # before state names it
            save(self.layout.state, state.with_bundle(bundle, bstate), step="pending")
            forget_digests(self.layout, state.with_bundle(bundle, bstate))
            # collected only once state no longer names them: a crash never leaves a dangling id
            self.store.collect(g for g in before.generations if g not in bstate.generations)
            faults.hit("store.collected")
            write_status(
                self.layout,
                bundle,
                bstate,
                generation=generation,
                version=manifest.version,
                kernel=manifest.kernel,
            )
            faults.hit("intake.recorded")
        except (Rejected, DropError, ManifestError) as exc:
            reasons = exc.reasons if isinstance(exc, Rejected) else [str(exc)]
            return self._reject(drop, bundle, reasons)
        seconds = time.monotonic() - started
        log.info(
            "drop.accepted",
            drop=drop.name,
            bundle=bundle,
            generation=generation,
            ms=round(seconds * 1000),
        )
        self._remove(drop, "taken in")
        return Outcome(drop, bundle, generation, True, seconds=seconds)

    def _reject(self, drop: Path, bundle: str | None, reasons: list[str]) -> Outcome:
        """Record a rejection (status, log) and move the drop to the quarantine."""
        shown_reasons = bounded(reasons)
        log.warning("drop.rejected", drop=drop.name, bundle=bundle, reasons=shown_reasons)
        if bundle is not None:
            try:
                state = load(self.layout.state)
                if bundle not in state.bundles and not self._may_keep_status(bundle):
                    raise _NoStatus
                write_status(
                    self.layout,
                    bundle,
                    state.bundle(bundle),
                    phase=Phase.REJECTED,
                    errors=shown_reasons,
                    drop=drop.name,
                )
                faults.hit("intake.rejected")
            except _NoStatus:
                pass
            except (OSError, ServiceError) as exc:  # a full disk, a corrupt state: logged
                log.error("status.unwritable", bundle=bundle, error=shown(exc))
        quarantine.put(self.layout, drop, bundle, shown_reasons, self.config.limits, self.tick)
        return Outcome(drop, bundle, None, False, tuple(shown_reasons))

    def _may_keep_status(self, bundle: str) -> bool:
        """Whether a rejection of ``bundle`` may leave a status file.

        Not for a bundle this host does not allow, nor for a new name once
        :data:`MAX_STATUS_FILES` exist: rejected names must not grow files without bound.
        """
        allowed = self.config.allowed_bundles
        if allowed and bundle not in allowed:
            return False
        if (self.layout.status / f"{bundle}.json").exists():
            return True
        try:
            entries = self.layout.status.iterdir()
            count = sum(1 for _, _n in zip(entries, range(MAX_STATUS_FILES), strict=False))
        except OSError:
            count = 0
        return count < MAX_STATUS_FILES

    def _remove(self, drop: Path, why: str) -> None:
        """Dispose of a drop taken in or superseded: into the trash by one rename.

        The trash is emptied after the scan (:meth:`empty_trash`), so a drop with a huge
        tree delays no other drop. Where the rename cannot be done (another file system)
        the drop is removed at once; one that resists goes to the quarantine.
        """
        try:
            _unlink_manifest(drop)
            faults.hit("drop.removing")
            self.layout.trash.mkdir(mode=0o700, exist_ok=True)
            try:
                os.rename(drop, self.layout.trash / drop.name)
            except OSError:
                remove_tree(
                    drop.parent,
                    drop.name,
                    max_entries=self.config.limits.max_tree_entries,
                    tick=self.tick,
                )
        except OSError as exc:
            reason = f"could not be removed after it was {why}: {exc}"
            quarantine.put(self.layout, drop, None, [reason], self.config.limits, self.tick)
            return
        log.debug("drop.removed", drop=drop.name, why=why)

    def _status_after_host_error(self, bundle: str | None, reason: str, drop: Path) -> None:
        if bundle is None:
            return
        try:
            current = load(self.layout.state).bundle(bundle)
            write_status(self.layout, bundle, current, errors=[reason], drop=drop.name)
        except OSError as exc:  # the disk that failed the intake may fail this too
            log.error("status.unwritable", bundle=bundle, error=str(exc))

    def _manifest(self, drop: Path) -> Manifest:
        limit = min(MAX_MANIFEST_BYTES, self.config.limits.max_manifest_bytes)
        fd = open_dir(drop)
        try:
            raw = read_small(fd, MANIFEST_NAME, display=drop, max_bytes=limit)
        finally:
            os.close(fd)
        manifest = Manifest.from_toml(raw, source=str(drop / MANIFEST_NAME))
        named = parse_drop_name(drop.name)
        if named and named[0] != manifest.bundle:
            raise Rejected(
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

    def _check_policy(self, manifest: Manifest, bundle: BundleState) -> None:
        cfg, problems = self.config, []
        if cfg.allowed_bundles and manifest.bundle not in cfg.allowed_bundles:
            problems.append(f"bundle {manifest.bundle!r} is not allowed on this host")
        if manifest.memory is not None and manifest.memory not in cfg.allowed_memory_policies:
            problems.append(f"memory policy {manifest.memory.value!r} is not allowed on this host")
        forbidden = {n.replace("-", "_") for n in cfg.forbidden_params}
        for i, module in enumerate(manifest.modules):
            problems += [f"module[{i}].params: {p}" for p in param_problems(module.params)]
            for name, _value in parse_params(module.params):
                if name.replace("-", "_") in forbidden:
                    problems.append(f"module[{i}].params: {name!r} is forbidden on this host")
        if bundle.held:
            problems.append(f"bundle {manifest.bundle!r} is held by an admin (modstage release)")
        failed = bundle.generations.get(manifest.digest)
        if failed is not None and failed.failed:
            problems.append(f"generation {manifest.digest[:12]} already failed: {failed.failed}")
        if problems:
            raise Rejected(problems)

    def _build(self, drop: Path, manifest: Manifest, generation: str, started: float) -> None:
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
            target = replace(
                Target.from_layout(self.layout, manifest.kernel),
                strict_crcs=self.config.require_symbol_crcs,
            )
            verdicts = verify_files(tmp, manifest, trust=self.trust, kernel=target, shown=drop)
            reasons = [f"{v.file}: {v.reason}" for v in verdicts if not v.ok]
            if not reasons:
                reasons = order_problems(verdicts[: len(manifest.modules)])
            if not reasons:
                reasons = self._preflight(manifest, verdicts[: len(manifest.modules)], target)
            if reasons:
                raise Rejected(reasons)
            tick()
            self.store.publish(tmp, generation)
        finally:
            self.store.discard(tmp)

    def _preflight(self, manifest: Manifest, verdicts: list[Verdict], target: Target) -> list[str]:
        """What the running kernel will refuse, when it enforces and is the target: asked
        as it asks (``.secondary_trusted_keys``, then ``.platform`` on ENOKEY when built
        with it, then the module's hash against ``.blacklist``)."""
        if manifest.kernel != self.layout.kernel_release():
            return []
        why = enforcing(self.layout)
        if why is None:
            return []
        platform = target.config.enabled("INTEGRITY_PLATFORM_KEYRING")
        reasons = [
            f"EKEYREJECTED: the running kernel ({why}) does not trust signing key {k}"
            for k in dict.fromkeys(v.key_id for v in verdicts if v.key_id)
            if not self.keyring.trusts(k, platform=platform)
        ]
        for v in verdicts:
            digest = v.image_sha256 or v.sha256
            if digest and self.keyring.blacklisted(digest):
                reasons.append(f"{v.file}: EKEYREJECTED: module hash {digest} is in .blacklist")
        return reasons


def record_pending(bundle: BundleState, manifest: Manifest, retain: int) -> BundleState:
    """The bundle with ``manifest``'s generation pending, forgetting generations past ``retain``.

    The caller removes the forgotten generations from the store after saving.
    """
    generation = manifest.digest
    if generation in (bundle.pending, bundle.active) and bundle.phase is not Phase.FAILED:
        return bundle
    gen = Generation(generation, manifest.version, manifest.kernel, added=time.time())
    moved = bundle.with_generation(gen).move(
        Phase.PENDING, pending=generation, note=f"generation {generation[:12]} pending"
    )
    keep = moved.keep() | {
        g.id for g in sorted(moved.generations.values(), key=lambda g: g.added)[-retain:]
    }
    return replace(moved, generations={k: v for k, v in moved.generations.items() if k in keep})


def _manifest_size(drop: Path) -> tuple[int, str]:
    """Sort key: drops with small manifests first, so a huge one delays no small one."""
    try:
        return os.lstat(drop / MANIFEST_NAME).st_size, drop.name
    except OSError:
        return 0, drop.name


def _unlink_manifest(drop: Path) -> None:
    """Unlink the drop's manifest first, so that a half-removed drop is never complete."""
    with contextlib.suppress(OSError):  # a directory there: remove_tree takes it
        os.unlink(drop / MANIFEST_NAME)


def _referenced(layout: Layout) -> set[str] | None:
    """Generations state.json names (None when it cannot be read: then clean nothing)."""
    try:
        state = read(layout.state)
    except (OSError, ServiceError):
        return None
    return {g for b in state.bundles.values() for g in b.generations}

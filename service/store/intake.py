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
import shutil
import time
from dataclasses import dataclass, replace
from pathlib import Path

import structlog

from service import faults
from service.config import Config
from service.errors import DropError
from service.layout import Layout
from service.store.dropfs import open_dir, read_small
from service.store.generations import Store
from service.store.publish import (
    forget_digests,
    incoming_dirs,
    mirror_status,
    read_digest,
    record_digest,
)
from service.store.state import BundleState, Generation, Phase, load, locked, save
from service.store.statusfile import write_status
from service.verify.keyring import Keyring, enforcing
from service.verify.trust import TrustStore
from service.verify.verdict import verify_files
from stager.errors import ManifestError
from stager.manifest import MAX_MANIFEST_BYTES, Manifest
from stager.params import parse_params
from stager.paths import MANIFEST_NAME, parse_drop_name

log = structlog.get_logger("modstage.intake")


@dataclass(frozen=True)
class Outcome:
    """What became of one drop."""

    drop: Path
    bundle: str | None
    generation: str | None
    accepted: bool
    reasons: tuple[str, ...] = ()
    deferred: bool = False  # the host failed; the drop is kept and retried
    seconds: float | None = None  # how long taking it in took (copy and verification)


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
            bundle, key = named
            if bundle in newest and newest[bundle][0] > key:
                _remove(entry, "superseded")
                continue
            if bundle in newest:
                _remove(newest[bundle][1], "superseded")
            newest[bundle] = (key, entry)
        return sorted(path for _key, path in newest.values())

    def run(self, drops: list[Path] | None = None) -> list[Outcome]:
        """Take in ``drops`` (default: every complete drop) one after the other."""
        with locked(self.layout.var):
            self.store.clean_temporaries()
            outcomes = [self.take(drop) for drop in (drops or self.complete_drops())]
            mirror_status(self.layout, self.config)
            return outcomes

    def take(self, drop: Path) -> Outcome:
        """Take in one drop (the caller holds the state lock).

        Never raises for anything the drop contains.
        """
        named = parse_drop_name(drop.name)
        bundle = named[0] if named else None
        bound = log.bind(drop=drop.name)
        started = time.monotonic()
        try:
            manifest = self._manifest(drop)
            bundle = manifest.bundle
            digest = self._digest(drop)
            state = load(self.layout.state)
            if state.bundle(bundle).phase is Phase.LOADING:
                raise Rejected([f"bundle {bundle!r} is being loaded; drop it again after boot"])
            self._check_policy(manifest, state.bundle(bundle))
            generation = manifest.digest
            write_status(
                self.layout,
                bundle,
                state.bundle(bundle),
                phase=Phase.VERIFYING,
                generation=generation,
            )
            faults.hit("intake.verifying")
            if not self.store.has(generation):
                self._build(drop, manifest, generation)
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
        except OSError as exc:
            reason = f"the host could not take the drop in, it is kept for the next run: {exc}"
            bound.error("drop.deferred", bundle=bundle, reason=reason)
            self._status_after_host_error(bundle, reason, drop)
            return Outcome(drop, bundle, None, False, (reason,), deferred=True)
        except (Rejected, DropError, ManifestError) as exc:
            reasons = exc.reasons if isinstance(exc, Rejected) else [str(exc)]
            bound.warning("drop.rejected", bundle=bundle, reasons=reasons)
            if bundle is not None:
                current = load(self.layout.state).bundle(bundle)
                write_status(
                    self.layout,
                    bundle,
                    current,
                    phase=Phase.REJECTED,
                    errors=reasons,
                    drop=drop.name,
                )
                faults.hit("intake.rejected")
            _remove(drop, "rejected")
            return Outcome(drop, bundle, None, False, tuple(reasons))
        seconds = time.monotonic() - started
        bound.info("drop.accepted", bundle=bundle, generation=generation, ms=round(seconds * 1000))
        _remove(drop, "taken in")
        return Outcome(drop, bundle, generation, True, seconds=seconds)

    def _status_after_host_error(self, bundle: str | None, reason: str, drop: Path) -> None:
        if bundle is None:
            return
        try:
            current = load(self.layout.state).bundle(bundle)
            write_status(self.layout, bundle, current, errors=[reason], drop=drop.name)
        except OSError as exc:  # the disk that failed the intake may fail this too
            log.error("status.unwritable", bundle=bundle, error=str(exc))

    def _manifest(self, drop: Path) -> Manifest:
        fd = open_dir(drop)
        try:
            raw = read_small(fd, MANIFEST_NAME, display=drop, max_bytes=MAX_MANIFEST_BYTES)
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

    def _build(self, drop: Path, manifest: Manifest, generation: str) -> None:
        fd = open_dir(drop)
        try:
            tmp = self.store.copy_drop(fd, manifest, display=drop, limits=self.config.limits)
        finally:
            os.close(fd)
        faults.hit("store.copied")
        try:
            verdicts = verify_files(
                tmp, manifest, trust=self.trust, kernel=manifest.kernel, shown=drop
            )
            reasons = [f"{v.file}: {v.reason}" for v in verdicts if not v.ok]
            if not reasons:
                reasons = self._preflight(manifest, [v.key_id for v in verdicts if v.key_id])
            if reasons:
                raise Rejected(reasons)
            self.store.publish(tmp, generation)
        finally:
            self.store.discard(tmp)

    def _preflight(self, manifest: Manifest, key_ids: list[str]) -> list[str]:
        """Signers the running kernel will refuse, when it enforces and is the target."""
        if manifest.kernel != self.layout.kernel_release():
            return []
        why = enforcing(self.layout)
        if why is None:
            return []
        return [
            f"EKEYREJECTED: the running kernel ({why}) does not trust signing key {k}"
            for k in dict.fromkeys(key_ids)
            if not self.keyring.trusts(k)
        ]


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


def _remove(drop: Path, why: str) -> None:
    """Remove a drop: its manifest first, so that a half-removed drop is never complete.

    A drop that is not a directory (a planted symlink, FIFO, file) is unlinked itself,
    never followed.
    """
    if os.path.islink(drop) or not os.path.isdir(drop):
        with contextlib.suppress(FileNotFoundError):
            os.unlink(drop)
    else:
        with contextlib.suppress(OSError):
            os.unlink(drop / MANIFEST_NAME)  # a directory there stays: rmtree takes it
        faults.hit("drop.removing")
        shutil.rmtree(drop, ignore_errors=True)
    log.debug("drop.removed", drop=drop.name, why=why)

"""``modstage wait``: the container's side of a staged load, read from ``status/<bundle>.json``.

The host writes the status file with the one crash-safe write, so each poll
sees a whole document. Which generation to wait for, in order of preference:
``--drop`` (the digest of its manifest if the host has not taken the drop in yet;
otherwise the generation the status file names, counting only documents written after
the drop was staged: its name carries the time); ``--generation``; without either, the
last drop of the bundle this container staged or can still see in the incoming directory
(:mod:`stager.staged`), as if given with ``--drop``; only with no drop at all, the
generation the status file names.
A rejection is ours when the status file names our drop, or, without one, when
it was written after the drop.

Exit codes: 0 active, 1 rejected or failed (or the ready file cannot be written),
2 usage (a bad option value; a status directory still missing after
:data:`MISSING_GRACE` seconds: the host may create it late, never that late), 3 timed out, 4 the
generation waits for another kernel than the running one (it loads after a reboot
into that kernel), 5 the boot found none of the devices its modules drive (absent hardware:
nothing failed, and the next boot with the device present loads it).
"""

from __future__ import annotations

import argparse
import re
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TextIO

from stager.schema.atomic import write_atomic
from stager.schema.failures import ManifestError, StagerError
from stager.schema.manifest import Manifest
from stager.schema.paths import BUNDLE_RE, parse_drop_name
from stager.schema.statusfile import FAILED, NO_DEVICE, OTHER_KERNEL, REJECTED, StatusFile
from stager.staged import Seen, last_drop

EXIT_ACTIVE = 0
EXIT_REFUSED = 1
EXIT_USAGE = 2
EXIT_TIMEOUT = 3
EXIT_OTHER_KERNEL = 4
EXIT_NO_DEVICE = 5
_GENERATION = re.compile(r"[0-9a-f]{8,64}\Z")
MISSING_GRACE = 60.0  # seconds a missing status directory is waited for


@dataclass
class StatusReader:
    """Reads ``status/<bundle>.json``; a status directory missing for ``grace`` seconds
    is an error (a wrong ``--status-dir`` must not wait forever)."""

    path: Path
    grace: float = MISSING_GRACE
    clock: Callable[[], float] = time.monotonic
    missing_since: float | None = None

    def __call__(self) -> StatusFile | None:
        """The status file, None while there is none; raises :class:`WaitUsage` past the grace."""
        directory = self.path.parent
        if directory.is_dir():
            self.missing_since = None
            return StatusFile.read(self.path)
        now = self.clock()
        self.missing_since = now if self.missing_since is None else self.missing_since
        if now - self.missing_since >= self.grace:
            raise WaitUsage(
                f"status directory {directory} still does not exist after {self.grace:g} s "
                "(is the host's status directory mounted there? see --status-dir)"
            )
        return None


class WaitUsage(StagerError):
    """``wait`` was given an option it cannot act on (exit 2)."""

    exit_code = EXIT_USAGE


def check_args(args: argparse.Namespace) -> None:
    """Refuse option values ``wait`` cannot act on, before waiting at all."""
    if args.timeout is not None and not args.timeout >= 0:
        raise WaitUsage(f"--timeout must be 0 or more seconds, not {args.timeout:g}")
    if not args.interval > 0:
        raise WaitUsage(f"--interval must be more than 0 seconds, not {args.interval:g}")
    if args.generation is not None and not _GENERATION.match(args.generation):
        raise WaitUsage(
            f"--generation {args.generation!r} is not a generation id "
            "(8 to 64 lowercase hex digits, as `modstage stage` and `status` print)"
        )
    if args.drop is not None:
        _check_drop(args.drop, args.bundle)


def _check_drop(drop: Path, bundle: str) -> None:
    """``--drop`` names a drop of ``bundle`` (``<bundle>.<time>.<token>``): an empty value
    (``"$(modstage stage …)"`` after a failed stage) would wait for whatever the status names."""
    named = parse_drop_name(drop.name)
    if not drop.name:
        raise WaitUsage(
            "--drop is empty: the `modstage stage` before it probably failed (see its error); "
            "nothing was staged to wait for"
        )
    if named is None:
        raise WaitUsage(
            f"--drop {str(drop)!r} is not a drop (<bundle>.<time>.<token>, the path "
            "`modstage stage` prints): the stage before it probably failed"
        )
    if named[0] != bundle:
        raise WaitUsage(f"--drop {drop.name!r} is a drop of bundle {named[0]!r}, not {bundle!r}")


@dataclass(frozen=True)
class Awaited:
    """What to wait for: a generation id, the drop's name, documents newer than ``since``."""

    generation: str | None = None
    drop: str | None = None
    since: float | None = None

    @classmethod
    def from_drop(cls, drop: Path, generation: str | None = None) -> Awaited:
        """The target for a drop ``modstage stage`` printed (the drop may be gone already)."""
        named = parse_drop_name(drop.name)
        since = int(named[1].split(".")[0]) / 1e9 if named else None
        if generation is None:
            try:
                generation = Manifest.read(drop).digest
            except (OSError, ManifestError):
                generation = None  # taken in (or never complete): rely on ``since``
        return cls(generation, drop.name, since)


@dataclass(frozen=True)
class Answer:
    """One look at the status file: ``code`` is None while there is more to wait for."""

    code: int | None
    message: str


def judge(doc: StatusFile | None, target: Awaited, boot_id: str | None = None) -> Answer:
    """What the status file ``doc`` (None: no file yet) means for ``target`` in boot
    ``boot_id`` (None: unknown): first whether it speaks of the target's drop yet
    (:func:`_about`), then what it records of the generation (:func:`_recorded`), else
    what that generation waits for (:func:`_waits`)."""
    if doc is None:
        return Answer(None, "waiting for the host (no status yet)")
    about = _about(doc, target)
    if isinstance(about, Answer):
        return about
    gen = _full(about.generation, doc) or doc.generation
    return _recorded(doc, about, gen, boot_id) or _waits(doc, about, gen)


def _about(doc: StatusFile, target: Awaited) -> Awaited | Answer:
    """The target with the generation the host took the drop in as, when it names none
    (the drop left incoming: only the host's record says what became of it); or the
    outcome before any generation counts: the document older than the drop, the drop
    rejected (whatever came after), the host with no record of it yet."""
    if target.since is not None and doc.updated < target.since:
        return Answer(None, "waiting for the host to take the drop in")
    if target.drop is not None and target.drop in doc.rejected:
        return Answer(EXIT_REFUSED, f"drop rejected: {doc.rejected[target.drop]}")
    if target.generation is None and target.drop is not None and doc.taken is not None:
        if target.drop not in doc.taken:
            return Answer(None, f"the host has no record of drop {target.drop} (yet)")
        return Awaited(doc.taken[target.drop], target.drop, target.since)
    return target


def _recorded(
    doc: StatusFile, target: Awaited, gen: str | None, boot_id: str | None
) -> Answer | None:
    """The end the status file records for generation ``gen``: failed, the drop rejected,
    no device, nothing loadable, another kernel, or active (a wait still while its modules
    are not live in this boot); None when it records none."""
    short = gen[:12] if gen else "-"
    errors = "; ".join(doc.errors) or "no reason given"
    if gen is not None and gen in doc.failed:
        return Answer(EXIT_REFUSED, f"generation {short} failed: {doc.failed[gen]}")
    if doc.phase == REJECTED and (doc.drop == target.drop or target.drop is None):
        return Answer(EXIT_REFUSED, f"drop rejected: {errors}")
    if doc.phase == NO_DEVICE and gen is not None and doc.generation == gen:
        why = f"{errors}; it loads at a boot with the device present"
        return Answer(EXIT_NO_DEVICE, f"generation {short} was not loaded: {why}")
    if doc.phase == FAILED and doc.generation == gen:  # nothing of the bundle is loaded
        return Answer(EXIT_REFUSED, f"generation {short} could not be loaded: {errors}")
    if doc.phase == OTHER_KERNEL and gen is not None and doc.active == gen:
        return Answer(
            EXIT_OTHER_KERNEL,
            f"generation {short} targets another kernel than the running "
            f"{doc.running_kernel or '?'}: nothing "
            f"of the bundle is loaded ({errors})",
        )
    if gen is not None and doc.active == gen and doc.pending != gen:  # pending again: reload
        earlier = boot_id is not None and doc.boot_id is not None and doc.boot_id != boot_id
        if earlier or doc.live is False:
            return Answer(
                None,
                f"generation {short} is recorded active, but its modules are not live in this "
                "boot (modstage boot has not loaded them yet)",
            )
        return Answer(EXIT_ACTIVE, f"generation {short} is active")
    return None


def _waits(doc: StatusFile, target: Awaited, gen: str | None) -> Answer:
    """What generation ``gen``, not yet at an end, waits for: an admin's release, a reboot
    into another kernel (exit 4: it loads there), the host's intake, or its phase."""
    short = gen[:12] if gen else "-"
    what = f"drop {target.drop} (generation {short})" if target.drop else f"generation {short}"
    if doc.held:
        return Answer(None, f"the bundle is held by an admin: {what} waits for modstage release")
    other, running = doc.pending_kernel, doc.running_kernel
    if gen is not None and doc.pending == gen and other and running and other != running:
        return Answer(EXIT_OTHER_KERNEL, f"waiting for kernel {other} (running {running})")
    waits = doc.drop is not None and doc.drop == target.drop and doc.errors
    if gen is not None and gen not in doc.known() and waits:  # deferred: kept in incoming
        errors = "; ".join(doc.errors) or "no reason given"
        return Answer(None, f"the drop waits in incoming: {errors}")
    if gen is not None and gen not in doc.known():
        known = f"the host names pending {_short(doc.pending)}, active {_short(doc.active)}"
        if target.drop:
            return Answer(None, f"waiting for the host to take in {what} ({known})")
        return Answer(None, f"generation {short} is not known to the host yet ({known})")
    return Answer(None, f"{doc.phase} (generation {short})")


def _short(generation: str | None) -> str:
    """A generation id as a line shows it: 12 digits, or ``none``."""
    return generation[:12] if generation else "none"


def _full(generation: str | None, doc: StatusFile) -> str | None:
    """The full id the status file names for a prefix (the prefix itself if none)."""
    if generation is None:
        return None
    found = [k for k in doc.known() if k.startswith(generation)]
    return found[0] if len(found) == 1 else generation


def wait_for(
    read: Callable[[], StatusFile | None],
    target: Awaited,
    emit: Callable[[str], None],
    *,
    timeout: float | None = None,
    interval: float = 1.0,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
    boot_id: str | None = None,
) -> int:
    """Poll ``read`` until ``target`` is decided or ``timeout`` passes; ``emit`` each change."""
    deadline = None if timeout is None else clock() + timeout
    last = None
    while True:
        outcome = judge(read(), target, boot_id)
        if outcome.message != last:
            emit(outcome.message)
            last = outcome.message
        if outcome.code is not None:
            return outcome.code
        if deadline is not None and clock() >= deadline:
            emit(f"timed out after {timeout:g} s; last seen: {outcome.message}")
            return EXIT_TIMEOUT
        left = None if deadline is None else deadline - clock()
        sleep(interval if left is None else max(0.0, min(interval, left)))


def choose_target(
    args: argparse.Namespace, emit: Callable[[str], None], doc: StatusFile | None = None
) -> Awaited:
    """``--drop``, else ``--generation``, else the last drop of the bundle this container can
    see (:mod:`stager.staged`) unless the status ``doc`` shows the host moved past it: never
    an answer for a generation older than that drop."""
    if args.drop is not None:
        return Awaited.from_drop(args.drop, args.generation)
    if args.generation is not None:
        return Awaited(args.generation)
    seen = last_drop(args.bundle, args.status_dir)
    if seen is None:
        return Awaited()
    target = Awaited.from_drop(seen.drop, seen.generation)
    if superseded(seen, target, doc):
        emit(
            f"the last drop staged, {seen.drop.name} (generation {_short(target.generation)}), "
            f"was superseded: the host names generation {_short(doc.generation if doc else None)} "
            "since; waiting for that"
        )
        return Awaited()
    where = "in" if seen.in_incoming else "taken in from"
    emit(
        f"waiting for the last drop staged, {seen.drop.name} (generation "
        f"{_short(target.generation) if target.generation else 'unknown yet'}; {where} "
        f"{seen.drop.parent})"
    )
    return target


def superseded(seen: Seen, target: Awaited, doc: StatusFile | None) -> bool:
    """Whether the host moved past the noted drop ``seen``: it is gone from incoming, and a
    status written after it was staged names neither its generation nor the drop (a newer
    drop was taken in since). Waiting for it would wait forever."""
    if seen.in_incoming or doc is None or target.generation is None or target.since is None:
        return False
    if doc.updated < target.since or doc.drop == seen.drop.name:
        return False
    return _full(target.generation, doc) not in doc.known()


def _boot_id(path: Path) -> str | None:
    """This boot's id (the kernel's ``boot_id``, the same inside a container); None if it
    cannot be read (then a status file's own boot is not checked)."""
    try:
        return path.read_text().strip() or None
    except (OSError, UnicodeDecodeError):
        return None


def _status_now(path: Path) -> StatusFile | None:
    """The status file as it is when wait starts; None if absent or unreadable (the wait's
    own reads report an unreadable one)."""
    try:
        return StatusFile.read(path)
    except StagerError:
        return None


def run(args: argparse.Namespace, out: TextIO) -> int:
    """``modstage wait``: print progress lines; exit 0 once the generation is active."""
    check_args(args)
    path = args.status_dir / f"{args.bundle}.json"

    def emit(message: str) -> None:
        print(f"{args.bundle}: {message}", file=out, flush=True)

    target = choose_target(args, emit, _status_now(path))

    if args.status_dir.is_dir() and not path.exists():
        known = sorted(
            p.stem
            for p in args.status_dir.glob("*.json")
            if p.stem != args.bundle and BUNDLE_RE.match(p.stem)  # not the host's _host.json
        )
        emit(
            f"no status for bundle {args.bundle!r} in {args.status_dir} yet (the host has "
            f"status for: {', '.join(known) or 'no bundle'}); waiting for its first drop"
        )
    if not args.status_dir.is_dir():
        emit(
            f"status directory {args.status_dir} does not exist yet; giving up after "
            f"{MISSING_GRACE:g} s unless it appears"
        )
    code = wait_for(
        StatusReader(path),
        target,
        emit,
        timeout=args.timeout,
        interval=args.interval,
        boot_id=_boot_id(args.boot_id_file),
    )
    if code == EXIT_ACTIVE and args.ready_file is not None:
        try:
            args.ready_file.parent.mkdir(parents=True, exist_ok=True)
            write_atomic(args.ready_file, b"")
        except OSError as exc:
            raise StagerError(
                f"the generation is active, but the ready file {args.ready_file} cannot be "
                f"written: {exc.strerror or exc}"
            ) from exc
    return code

"""Intake for the daemon, run in a short-lived child process.

Verifying a bundle needs the verification stack and OpenSSL's hashlib, and cryptography
once an EC key is used: about 8 MiB, 14 with cryptography, that a daemon would otherwise
hold for the rest of its life, and a heap grown by reading hundreds of MiB.
:class:`ChildIntake` has the daemon-facing shape of :class:`~service.intake.scan.Intake`
(``run()``, ``tick``, ``config``) and runs :mod:`service.cmd.intake_child` instead, reading
its progress and outcomes back.

The child takes the same state lock, so the semantics are those of ``modstage
intake``: a child killed mid-way leaves what a killed intake leaves, and the next
child (the next scan, or the next start) cleans up and takes the drop again; except a
child killed by ``SIGKILL`` while it copied and verified a drop (it says which, see
:mod:`~service.daemon.intake_protocol`): that is the out-of-memory killer at the unit's
``MemoryMax=``, and the drop is rejected (quarantined, with the reason) rather than
taken again, which would kill the next child too. A scan
that finds no complete drop, nothing in the trash and (the first after a start or a
failed child) nothing left in the store to clean starts no child: it only refreshes
the published status, under the lock, as an empty intake run would. The loop calls
:func:`prepare` when drop events arrive: if a complete drop is there, the child starts
at once and imports while the loop debounces, and the scan hands it its go.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import service
from service.bundles.statefile import locked
from service.config import Config
from service.daemon.intake_protocol import BUILDING, TICK, ChildResult, built
from service.generations.store import TMP_PREFIX
from service.intake.drops import Drops
from service.intake.outcome import Outcome
from service.intake.rejection import reject
from service.layout import Layout
from service.publish.operator import incoming_dirs, mirror_status
from stager.schema.paths import MANIFEST_NAME, parse_drop_name
from stager.schema.shown import shown

CHILD = "service.cmd.intake_child"
KILLED = (
    "ENOMEM: the intake was killed (SIGKILL) while copying and verifying this drop, most"
    " likely by the out-of-memory killer at the daemon unit's MemoryMax= (see"
    " deploy/README.md); the drop is rejected, not taken again"
)
#: What the child must not inherit: systemd would take its messages for the daemon's.
NOT_INHERITED = ("NOTIFY_SOCKET", "WATCHDOG_USEC", "WATCHDOG_PID")


def has_work(layout: Layout, config: Config, stuck: dict[str, str] | None = None) -> bool:
    """Whether an intake run would take or remove anything: a complete drop that is not
    ``stuck`` (nor recorded as left in place), or trash."""
    drops = Drops(layout, config, stuck=stuck if stuck is not None else {})
    try:
        if any(os.scandir(layout.trash)):
            return True
    except OSError:
        pass
    for directory in incoming_dirs(layout, config):
        try:
            entries = list(os.scandir(directory))
        except OSError:
            continue
        for entry in entries:
            drop = Path(entry.path)
            if (
                parse_drop_name(entry.name)
                and os.path.lexists(drop / MANIFEST_NAME)
                and not drops.skipped(drop)
            ):
                return True
    return False


def prepare(intake: object) -> None:
    """Start a :class:`ChildIntake`'s child early (see the module's docstring); any other
    intake (the in-process one tests use) needs no preparing."""
    if isinstance(intake, ChildIntake):
        intake.prepare()


def needs_cleaning(layout: Layout) -> bool:
    """Whether a killed intake or collection left something in the store (a temporary
    directory, a generation without its manifest) that an intake run would clean."""
    try:
        entries = list(os.scandir(layout.store))
    except OSError:
        return False
    return any(
        e.name.startswith(TMP_PREFIX) or not os.path.lexists(Path(e.path) / MANIFEST_NAME)
        for e in entries
    )


def child_env(environ: dict[str, str] | None = None) -> dict[str, str]:
    """The child's environment: the daemon's, minus systemd's notify variables, with the
    daemon's own ``service`` package first on ``PYTHONPATH`` (the same code runs)."""
    env = {k: v for k, v in (environ or dict(os.environ)).items() if k not in NOT_INHERITED}
    here = str(Path(service.__file__).resolve().parent.parent)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (here, env.get("PYTHONPATH")) if p)
    return env


@dataclass
class ChildIntake:
    """Intake in a child process; see the module's docstring."""

    layout: Layout
    config: Config
    tick: Callable[[], None] = field(default=lambda: None)  # per progress line of the child
    python: Sequence[str] = (sys.executable,)
    started_once: bool = False  # the first run checks the store for what a crash left
    stuck: dict[str, str] = field(default_factory=dict)  # drops that cannot be removed
    warm: subprocess.Popen[bytes] | None = None  # started by prepare(), waiting for its go

    def prepare(self) -> None:
        """Start the child now if a complete drop waits, so that its interpreter and imports
        overlap the loop's debounce; :meth:`run` then hands it the go."""
        if self.warm is None and has_work(self.layout, self.config, self.stuck):
            self.warm = self._spawn()

    def _discard_warm(self) -> None:
        """Let a prepared child go unused: end of input tells it to exit doing nothing."""
        if self.warm is not None:
            warm, self.warm = self.warm, None
            assert warm.stdin is not None and warm.stdout is not None
            with contextlib.suppress(OSError):
                warm.stdin.close()
            warm.stdout.close()  # the subprocess module reaps it later; no wait here

    def run(self) -> list[Outcome]:
        """Take in every complete drop; raise what the child's run raised, as a ServiceError."""
        cleaning = not self.started_once and needs_cleaning(self.layout)
        if not cleaning and not has_work(self.layout, self.config, self.stuck):
            self._discard_warm()
            self.started_once = True
            with locked(self.layout.var):
                mirror_status(self.layout, self.config)
            return []
        self.started_once = False  # until a child succeeds: then the store is clean
        result, killed = self._child()
        result.raise_failure()
        self.started_once = not killed  # a killed child left its copy in the store
        self.stuck = dict(result.stuck)
        return list(result.outcomes)

    def _spawn(self) -> subprocess.Popen[bytes]:
        """The child, started and waiting for its go (one line on its standard input)."""
        command = [*self.python, "-m", CHILD, "--root", str(self.layout.root)]
        return subprocess.Popen(
            command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=child_env()
        )

    def _child(self) -> tuple[ChildResult, bool]:
        """Give the (prepared or new) child its go, relay its ticks; its result, and
        whether it was killed building a drop (then that drop's rejection is the result)."""
        proc, self.warm = (self.warm or self._spawn()), None
        with proc:
            assert proc.stdin is not None and proc.stdout is not None
            with contextlib.suppress(BrokenPipeError):  # a child that died at once says why
                proc.stdin.write(json.dumps({"stuck": self.stuck}).encode() + b"\n")
                proc.stdin.close()
            last, drop = b"", None
            for line in proc.stdout:
                if line == TICK:
                    self.tick()
                elif line.startswith(BUILDING):
                    with contextlib.suppress(ValueError):
                        drop = built(line)
                else:
                    last = line
            code = proc.wait()
        if code == -signal.SIGKILL and drop is not None:
            return ChildResult((self._killed_on(Path(drop)),), self.stuck), True
        try:
            return ChildResult.from_json(json.loads(last)), False
        except (ValueError, TypeError, KeyError):  # Outcome.from_json's refusals too
            return ChildResult(error=f"exited with {code} and no result: {shown(last)}"), False

    def _killed_on(self, drop: Path) -> Outcome:
        """Reject the drop a child was killed building: the kernel's out-of-memory killer
        picks the largest process in the unit once it passes ``MemoryMax=``, and that is
        the child holding this drop. Taken again, it would kill the next child too."""
        named = parse_drop_name(drop.name)
        bundle = named[0] if named else None
        with locked(self.layout.var):
            if not os.path.lexists(drop):
                return Outcome(drop, bundle, None, False, (KILLED,), gone=True)
            drops = Drops(self.layout, self.config, stuck=self.stuck)
            outcome = reject(self.layout, self.config, drops, drop, bundle, [KILLED])
            mirror_status(self.layout, self.config)
        return outcome

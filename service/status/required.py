"""``modstage status --reboot-required``: kured's sentinel command.

kured (1.15 and later) runs its ``--reboot-sentinel-command`` through ``nsenter`` in the
host's mount namespace and reads only the exit code:

* :data:`REQUIRED` (0): reboot the node;
* :data:`NOT_REQUIRED` (1): nothing to do, and kured says nothing;
* :data:`UNKNOWN` (3): modstage cannot tell (corrupt or unreadable state, an unreadable
  config, an unreadable kernel release or boot id, a wrong ``--root``). kured treats any
  code other than 0 and 1 as "not required" and logs a warning carrying our stderr, so
  the reason reaches kured's log and the node is never rebooted on a guess. Exit 1 is
  never used for an error;
* :data:`HELD` (4): a reboot is wanted but the next boot runs a kernel a bundle with a
  driver now has no generation for (:mod:`service.rebooting.gate`): held, with the gate's words on
  stdout, which kured logs with its warning, until a driver for that kernel is accepted or
  ``[kernel] hold_max`` has passed.

A reboot is required when either

* the host's own reboot-required file exists (``/var/run/reboot-required``, which
  unattended-upgrades and needrestart write on Debian and Ubuntu): kured's default
  sentinel, kept so that moving kured to this command drops none of those reboots; or
* a pending generation waits for the running kernel and modstage wants the reboot now:
  with ``[reboot] backend = "none"`` at once (kured's window and lock decide when); with
  any other backend only once the daemon has recorded its request in this boot (its
  ``min_delay`` and window let several drops share one reboot).

Plain ``status`` shows the same answer (:func:`answer`): its reboot line says
``unknown: <file> could not be read (<reason>)`` exactly when this command exits 3.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path
from typing import TextIO

from service.bundles.state import State
from service.bundles.statefile import read
from service.config import Config
from service.errors import ConfigError, HostFactUnreadable, ServiceError
from service.host.running import RunningHost
from service.layout import Layout
from service.rebooting.backends import admin_reboots
from service.rebooting.gate import Gate, gate_for

REQUIRED, NOT_REQUIRED, UNKNOWN, HELD = 0, 1, 3, 4


class CannotTell(ServiceError):
    """An input of the answer at ``path`` could not be read or used; ``reason`` says why."""

    def __init__(self, path: object, reason: str) -> None:
        self.path, self.reason = str(path), reason
        super().__init__(f"{self.path} could not be read ({reason})")

    @classmethod
    def of(cls, path: Path, exc: ServiceError) -> CannotTell:
        """``exc`` about the file at ``path`` (its text without the path it may start with)."""
        text = str(exc).removeprefix(f"{path}: ").removeprefix("cannot read: ")
        return cls(path, text or type(exc).__name__)


@dataclass(frozen=True)
class Answer:
    """Whether a reboot is required, and why (one line per reason); ``unknown``: why
    modstage cannot tell (then ``required`` is False and means nothing). ``held``: a reboot
    is wanted (``reasons``) but waits at the gate (then ``required`` is False); ``gate``:
    the next kernel's gate, whenever some bundle lacks a generation for it."""

    required: bool
    reasons: tuple[str, ...] = ()
    unknown: str | None = None
    held: bool = False
    gate: Gate | None = None


def decide(
    state: State,
    *,
    kernel: str,
    backend: str,
    boot_id: str,
    host_file: str | None,
    gate: Gate | None = None,
) -> Answer:
    """The answer from plain values; ``host_file`` is the host sentinel's path if it exists;
    ``gate`` the next kernel's, when the next boot runs another kernel than ``kernel``."""
    waiting = state.awaiting_reboot(kernel)
    asked = state.intent_in(boot_id) is not None
    reasons: list[str] = []
    if waiting and (admin_reboots(backend) or asked):
        reasons.append(" ".join(waiting))
    if host_file is not None:
        reasons.append(f"{host_file} exists")
    gate = gate if gate is not None and gate.bundles else None
    if reasons and gate is not None and gate.holds:
        return Answer(False, tuple(reasons), held=True, gate=gate)
    if reasons and gate is not None:
        reasons.append(gate.line())
    return Answer(bool(reasons), tuple(reasons), gate=gate)


def _state(path: Path) -> State:
    """``state.json`` read without touching it; a set-aside corrupt one is an error too."""
    if not path.exists() and not path.is_symlink():
        aside = sorted(path.parent.glob(f"{path.name}.corrupt-*"))
        if aside:
            raise CannotTell(aside[-1], "an earlier state file was corrupt, set aside")
    try:
        return read(path)
    except PermissionError as exc:
        raise CannotTell(path, "permission denied: run as root") from exc
    except OSError as exc:
        raise CannotTell(path, exc.strerror or str(exc)) from exc
    except ServiceError as exc:
        raise CannotTell.of(path, exc) from exc


def check(layout: Layout) -> Answer:
    """Read the host under ``layout`` and decide; any unreadable input raises
    :class:`CannotTell`."""
    if not layout.root.is_dir():
        raise CannotTell(layout.root, "--root is not a directory")
    try:
        config = Config.load(layout.config)
    except ConfigError as exc:
        why = "; ".join(p.removeprefix("cannot read: ") for p in exc.problems)
        raise CannotTell(layout.config, why) from exc
    running = RunningHost.read(layout)
    try:
        kernel, boot_id = running.need_release(), running.need_boot_id()
    except HostFactUnreadable as exc:
        raise CannotTell(exc.path, exc.reason) from exc
    state = _state(layout.state)
    host = layout.reboot_sentinel
    return decide(
        state,
        kernel=kernel,
        backend=config.reboot.backend,
        boot_id=boot_id,
        host_file=str(host) if host.exists() else None,
        gate=gate_for(layout, config, state, kernel, time.time()),
    )


def answer(layout: Layout) -> Answer:
    """:func:`check`, with why it cannot tell in ``unknown`` instead of an exception: the
    one answer both ``status`` and ``status --reboot-required`` give."""
    try:
        return check(layout)
    except ServiceError as exc:
        return Answer(False, unknown=str(exc))
    except Exception as exc:  # kured must get a warning, never a traceback and exit 1
        return Answer(False, unknown=f"{type(exc).__name__}: {exc}")


def run(layout: Layout, out: TextIO, err: TextIO) -> int:
    """Print the reasons (or "no reboot required") and return kured's exit code."""
    found = answer(layout)
    if found.unknown is not None:
        print(f"modstage status --reboot-required: cannot tell: {found.unknown}", file=err)
        return UNKNOWN
    if found.held and found.gate is not None:  # kured logs it with a warning
        print(f"{found.gate.line()}; wanted: {'; '.join(found.reasons)}", file=out)
        return HELD
    print("\n".join(found.reasons) if found.required else "no reboot required", file=out)
    return REQUIRED if found.required else NOT_REQUIRED

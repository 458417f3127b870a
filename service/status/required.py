"""``modstage status --reboot-required``: kured's sentinel command.

kured (1.15 and later) runs its ``--reboot-sentinel-command`` through ``nsenter`` in the
host's mount namespace and reads only the exit code:

* :data:`REQUIRED` (0): reboot the node;
* :data:`NOT_REQUIRED` (1): nothing to do, and kured says nothing;
* :data:`UNKNOWN` (3): modstage cannot tell (corrupt or unreadable state, an unreadable
  config, a wrong ``--root``). kured treats any code other than 0 and 1 as "not required"
  and logs a warning carrying our stderr, so the reason reaches kured's log and the node
  is never rebooted on a guess. Exit 1 is never used for an error.

A reboot is required when either

* the host's own reboot-required file exists (``/var/run/reboot-required``, which
  unattended-upgrades and needrestart write on Debian and Ubuntu): kured's default
  sentinel, kept so that moving kured to this command drops none of those reboots; or
* a pending generation waits for the running kernel and modstage wants the reboot now:
  with ``[reboot] backend = "none"`` at once (kured's window and lock decide when); with
  any other backend only once the daemon has recorded its request in this boot (its
  ``min_delay`` and window let several drops share one reboot).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TextIO

from service.backends import admin_reboots
from service.config import Config
from service.errors import ServiceError
from service.layout import Layout
from service.status.collect import read_state
from service.store.state import State

REQUIRED, NOT_REQUIRED, UNKNOWN = 0, 1, 3


@dataclass(frozen=True)
class Answer:
    """Whether a reboot is required, and why (one line per reason)."""

    required: bool
    reasons: tuple[str, ...] = ()


def decide(
    state: State,
    *,
    kernel: str,
    backend: str,
    boot_id: str,
    host_file: str | None,
) -> Answer:
    """The answer from plain values; ``host_file`` is the host sentinel's path if it exists."""
    waiting = state.awaiting_reboot(kernel)
    asked = state.intent_in(boot_id) is not None
    reasons: list[str] = []
    if waiting and (admin_reboots(backend) or asked):
        reasons.append(" ".join(waiting))
    if host_file is not None:
        reasons.append(f"{host_file} exists")
    return Answer(bool(reasons), tuple(reasons))


def _read(path: Path, what: str) -> str:
    try:
        return path.read_text().strip()
    except OSError as exc:
        raise ServiceError(f"{path}: cannot read {what}: {exc.strerror or exc}") from exc


def _state(path: Path) -> State:
    """``state.json`` read without touching it; a set-aside corrupt one is an error too."""
    if not path.exists() and not path.is_symlink():
        aside = sorted(path.parent.glob(f"{path.name}.corrupt-*"))
        if aside:
            raise ServiceError(f"{aside[-1]}: an earlier state file was corrupt, set aside")
    return read_state(path)


def check(layout: Layout) -> Answer:
    """Read the host under ``layout`` and decide; any unreadable input raises ServiceError."""
    if not layout.root.is_dir():
        raise ServiceError(f"--root {layout.root}: not a directory")
    config = Config.load(layout.config)
    kernel = _read(layout.os_release, "the running kernel's release")
    boot_id = _read(layout.boot_id, "the boot id")
    state = _state(layout.state)
    host = layout.reboot_sentinel
    return decide(
        state,
        kernel=kernel,
        backend=config.reboot.backend,
        boot_id=boot_id,
        host_file=str(host) if host.exists() else None,
    )


def run(layout: Layout, out: TextIO, err: TextIO) -> int:
    """Print the reasons (or "no reboot required") and return kured's exit code."""
    try:
        answer = check(layout)
    except ServiceError as exc:
        print(f"modstage status --reboot-required: cannot tell: {exc}", file=err)
        return UNKNOWN
    except Exception as exc:  # kured must get a warning, never a traceback and exit 1
        print(
            f"modstage status --reboot-required: cannot tell: {type(exc).__name__}: {exc}",
            file=err,
        )
        return UNKNOWN
    print("\n".join(answer.reasons) if answer.required else "no reboot required", file=out)
    return REQUIRED if answer.required else NOT_REQUIRED

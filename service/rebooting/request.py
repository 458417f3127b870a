"""Asking for a reboot through the cluster's machinery: one backend each.

Whether one is due is decided elsewhere, from plain values: which bundles wait for it
(``State.awaiting_reboot``) and when (:func:`service.rebooting.window.reboot_due`); backends act.
"""

from __future__ import annotations

import json
import subprocess
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

from service.errors import RebootError
from service.host.nextboot import next_kernel
from service.host.running import RunningHost
from service.layout import Layout
from service.rebooting.backends import BACKENDS
from service.rebooting.config import RebootConfig
from stager.schema.atomic import write_atomic


class Rebooter(Protocol):
    """Asks for a reboot in one way; ``name`` is the config's backend name."""

    name: str

    def request(self, reason: str) -> None:
        """Ask for a reboot (may return before it happens, or never return)."""

    def clear(self) -> None:
        """Withdraw the request once the reboot happened (most backends have nothing to do)."""


Runner = Callable[[list[str]], None]


def run_command(argv: list[str]) -> None:
    """Run ``argv``; a failure is a :class:`RebootError` with its output."""
    try:
        done = subprocess.run(argv, capture_output=True, text=True, check=False, timeout=120)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise RebootError(f"{argv[0]}: {exc}") from exc
    if done.returncode != 0:
        raise RebootError(f"{' '.join(argv)} exited {done.returncode}: {done.stderr.strip()}")


@dataclass(frozen=True)
class SandboxRunner:
    """Under a sandbox ``--root``: record each command in ``path`` instead of running it.

    ``path`` (``<root>/run/modstage/reboot-commands``) gets one line per command, the
    argv as JSON, so a test or an admin sees what would have rebooted the machine.
    """

    path: Path

    def __call__(self, argv: list[str]) -> None:
        """Append ``argv`` to the record."""
        try:
            before = self.path.read_bytes()
        except FileNotFoundError:
            before = b""
        except OSError as exc:
            raise RebootError(f"{self.path}: cannot read: {exc.strerror or exc}") from exc
        self.path.parent.mkdir(parents=True, exist_ok=True)
        write_atomic(self.path, before + json.dumps(argv).encode() + b"\n")


@dataclass
class KuredSentinel:
    """kured reboots the node (cluster lock, drain, window) once its sentinel file exists."""

    path: Path
    name: str = "kured"

    def request(self, reason: str) -> None:
        """Write the sentinel (one another tool wrote already asks for the same reboot)."""
        if self.path.exists() and not self._mine():
            return
        self.path.parent.mkdir(parents=True, exist_ok=True)
        write_atomic(self.path, f"modstage: {reason}\n".encode())

    def _mine(self) -> bool:
        try:
            return self.path.read_bytes().startswith(b"modstage: ")
        except OSError:
            return False

    def clear(self) -> None:
        """Remove the sentinel once the reboot happened, unless another tool wrote it.

        The default path is the host's ``/var/run/reboot-required``, which
        unattended-upgrades writes too: only a file this backend wrote is removed.
        """
        if self._mine():
            self.path.unlink(missing_ok=True)


@dataclass
class CommandRebooter:
    """Reboot by running commands in order (``systemctl reboot``; kexec's load, then kexec).

    ``plan`` gives the commands when the reboot is asked (kexec loads the kernel the next boot
    runs, its image and initrd).
    """

    plan: Callable[[], list[list[str]]]
    name: str = "command"
    runner: Runner = run_command
    problem: Callable[[], str | None] = lambda: None  # why this host cannot, asked first

    def request(self, reason: str) -> None:
        """Run the commands; the backend's problem on this host, or the first command
        that fails, raises :class:`RebootError`."""
        if (why := self.problem()) is not None:
            raise RebootError(why)
        for argv in self.plan():
            self.runner(argv)

    def clear(self) -> None:
        """Nothing to withdraw."""


@dataclass
class NoRebooter:
    """Never reboots: status says a reboot is required and an admin reboots."""

    name: str = "none"
    requests: list[str] = field(default_factory=list)

    def request(self, reason: str) -> None:
        """Remember the reason (shown by status)."""
        self.requests.append(reason)

    def clear(self) -> None:
        """Nothing to withdraw."""


def sentinel_path(config: RebootConfig, layout: Layout) -> Path:
    """kured's sentinel file: the config's ``sentinel`` under the root, else the layout's."""
    return layout.host(config.sentinel) if config.sentinel else layout.reboot_sentinel


def rebooter(config: RebootConfig, layout: Layout, kernel_next: str | None = None) -> Rebooter:
    """The backend the config names (:data:`service.rebooting.backends.BACKENDS`); under a sandbox
    root its commands are only recorded. A backend's commands get the kernel the next boot
    runs (:func:`next_release`; ``kernel_next``: the config's ``[kernel] next``)."""
    chosen = BACKENDS[config.backend]
    if chosen.sentinel:
        return KuredSentinel(sentinel_path(config, layout), name=chosen.name)
    if chosen.commands is not None:
        runner: Runner = run_command
        if RunningHost.read(layout).sandboxed:
            runner = SandboxRunner(layout.run / "reboot-commands")
        commands, check = chosen.commands, chosen.check
        return CommandRebooter(
            lambda: commands(config.command, layout, next_release(layout, kernel_next)),
            name=chosen.name,
            runner=runner,
            problem=lambda: (
                None if check is None else check(layout, next_release(layout, kernel_next))
            ),
        )
    return NoRebooter(name=chosen.name)


def next_release(layout: Layout, configured: str | None = None) -> str:
    """The kernel the next boot runs (:mod:`service.host.nextboot`), else the running one
    when that cannot be told (a reboot then runs what the boot loader picks; kexec reloads
    the running kernel)."""
    found = next_kernel(layout, configured)
    return found.release if found.release is not None else RunningHost.read(layout).need_release()

"""Errors raised by the host side.

::

    ServiceError                    every failure of the service package
    ├── ConfigError                 /etc/modstage/config.toml is unreadable or invalid
    ├── UsageError                  a command was called with arguments it cannot act on
    │   └── NotRoot                 a root-only file cannot be read or written: run as root
    ├── TrustError                  a trusted-certificate file or directory is unusable
    ├── DropError                   a file of a drop is unsafe or unreadable (names it)
    ├── LoadError                   the kernel refused to load or unload a module (errno)
    ├── BootError                   a generation could not be brought up at boot
    │   └── NoDevice                its modules found none of the devices they are for
    ├── RebootError                 the reboot backend could not ask for a reboot
    ├── StateError                  an illegal phase transition or an inconsistent state file
    │   ├── StateCorrupt            state.json was unreadable and has been moved aside
    │   └── IllegalTransition       a transition asked in a phase that may not precede it
    ├── ModuleRejected              a module the kernel would refuse (also a ValueError);
    │                               ``reason`` names the rule and the kernel's errno
    ├── TargetFileError             a target kernel's own file (vmlinuz, an in-tree module,
    │                               Module.symvers, the exports cache) cannot be used
    └── HostFactUnreadable          a fact of the running host (its kernel release, its boot
                                    id) is unreadable or empty (also an OSError)

Later parts add their leaves here (verification, intake, state, loading).
"""

from __future__ import annotations

from typing import NamedTuple


class ServiceError(Exception):
    """Root of every error raised by :mod:`service`."""


class ConfigError(ServiceError):
    """The host configuration at ``path`` is invalid; ``problems`` says how."""

    def __init__(self, path: object, problems: list[str]) -> None:
        self.path = str(path)
        self.problems = tuple(problems)
        super().__init__(f"{self.path}: " + "; ".join(self.problems))


class UsageError(ServiceError):
    """A command cannot act on the arguments it was given."""


class NotRoot(UsageError, PermissionError):
    """``path`` is root's alone (``state.json``, the state lock): the command needs root.

    A command run without it says so (exit 2), never a grade or advice drawn from what it
    could not read."""

    def __init__(self, path: object) -> None:
        self.path = str(path)
        super().__init__(f"{self.path}: permission denied: run as root (sudo modstage ...)")


class TrustError(ServiceError):
    """The trusted certificate at ``path`` cannot be used; ``reason`` says why."""

    def __init__(self, path: object, reason: str) -> None:
        self.path = str(path)
        self.reason = reason
        super().__init__(f"{self.path}: {reason}")


# finit_module's errno under sig_enforce for what the signature check returns
_ENFORCED = {"ENODATA": "EKEYREJECTED", "ENOPKG": "EKEYREJECTED", "ENOKEY": "EKEYREJECTED"}


class Refusal(NamedTuple):
    """Why a module is refused: the errno of the check that refuses it, and its words.

    ``policy``: refused by a modstage policy where the kernel itself would load the
    module (the errno is then the one the rule is closest to, not one the kernel gives).
    Rendered as text only at the edge (:meth:`__str__`).
    """

    errno: str  # e.g. "ENOEXEC", the name the check returns
    message: str
    policy: bool = False

    @property
    def enforced(self) -> str:
        """The errno ``finit_module`` returns on a target enforcing signatures."""
        return _ENFORCED.get(self.errno, self.errno)

    def __str__(self) -> str:
        return f"{self.errno}{' (policy)' if self.policy else ''}: {self.message}"


class ModuleRejected(ServiceError, ValueError):
    """A module fails a check the kernel (or modstage's stricter policy) applies at load.

    ``refusal`` holds the errno the kernel would return and the words, e.g.
    ``Refusal("EKEYREJECTED", "module signature has signed attributes")``; ``reason`` is
    its text. ``path`` is empty while a parser does not know which file it reads.
    """

    def __init__(
        self, errno: str, message: str, *, policy: bool = False, path: object = ""
    ) -> None:
        self.refusal = Refusal(errno, message, policy)
        self.reason = str(self.refusal)
        self.path = str(path)
        super().__init__(f"{self.path}: {self.reason}" if self.path else self.reason)

    @classmethod
    def of(cls, refusal: Refusal) -> ModuleRejected:
        """The error carrying ``refusal``."""
        return cls(refusal.errno, refusal.message, policy=refusal.policy)


class StateError(ServiceError):
    """``state.json`` is inconsistent, or a phase transition is not allowed."""


class StateCorrupt(StateError):
    """``state.json`` could not be read; it was moved to ``aside`` (``moved``; a dry run
    moves nothing and says where it would go) and must be looked at."""

    def __init__(self, path: object, aside: object, reason: str, *, moved: bool = True) -> None:
        self.path = str(path)
        self.aside = str(aside)
        self.reason = reason
        self.moved = moved
        where = "moved aside to" if moved else "the boot would move it aside to"
        super().__init__(f"{self.path}: {reason}; {where} {self.aside}")


class IllegalTransition(StateError):
    """Transition ``verb`` was asked of a bundle in ``phase``, which may not precede it."""

    def __init__(self, verb: str, phase: str, reason: str) -> None:
        self.verb = verb
        self.phase = phase
        self.reason = reason
        super().__init__(f"illegal transition {verb} from {phase}: {reason}")


class DropError(ServiceError):
    """A drop cannot be taken in because of ``path``; ``reason`` says why in plain words."""

    def __init__(self, path: object, reason: str) -> None:
        self.path = str(path)
        self.reason = reason
        super().__init__(f"{self.path}: {reason}")


class LoadError(ServiceError):
    """The kernel refused to load or unload a module; ``errno`` is its error code."""

    def __init__(self, code: int, message: str) -> None:
        self.errno = code
        self.message = message
        super().__init__(message)


class BootError(ServiceError):
    """A generation could not be brought up at boot; ``reason`` says why in plain words."""

    def __init__(self, reason: str) -> None:
        self.reason = reason
        super().__init__(reason)


class NoDevice(BootError):
    """A module's init returned ENODEV and none of the PCI devices its aliases match is
    present and free: the hardware is absent, the generation is not broken."""


class RebootError(ServiceError):
    """Asking for a reboot failed (the backend's command or file)."""


class TargetFileError(ServiceError):
    """A file of the target kernel at ``path`` cannot be read as it must; ``reason`` says why.

    Verification then falls back to the next source of the same facts.
    """

    def __init__(self, path: object, reason: str) -> None:
        self.path = str(path)
        self.reason = reason
        super().__init__(f"{self.path}: {reason}")


class HostFactUnreadable(ServiceError, OSError):
    """A fact of the running host at ``path`` (its kernel release, its boot id) could not be
    read or is empty; ``reason`` says why (:class:`service.host.running.RunningHost`).

    Also an OSError, so a caller that took an unreadable procfs file as one still does.
    """

    def __init__(self, path: object, reason: str) -> None:
        self.path, self.reason = str(path), reason
        super().__init__(f"{self.path} could not be read ({reason})")
        self.strerror = reason

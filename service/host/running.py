"""The running host's facts, read once per command and passed down.

Which kernel runs (``/proc/sys/kernel/osrelease``), which boot this is
(``/proc/sys/kernel/random/boot_id``) and whether ``--root`` is a sandbox are read here
and nowhere else: :meth:`RunningHost.read` reads them under a :class:`~service.layout.Layout`,
which itself only names paths.

The one failure rule: a fact that cannot be read (the file is missing, unreadable, not
text) or is empty is None, and the reason is kept. A caller that can go on without it
(a label, a status file, the announcement) uses None; a caller that needs it calls
:meth:`RunningHost.need_release` or :meth:`RunningHost.need_boot_id`, which raise
:class:`~service.errors.HostFactUnreadable` naming the file and the reason (also an
OSError, as the scattered reads raised before). An empty file counts as unreadable
everywhere (``status --reboot-required`` already said so; boot and the daemon took an
empty release as the kernel ``""`` and an empty boot id as a boot).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from service.errors import HostFactUnreadable
from service.layout import Layout, is_host_root


def read_fact(path: Path) -> str:
    """A one-line fact of the host at ``path``, stripped; raises
    :class:`~service.errors.HostFactUnreadable` when it cannot be read or is empty."""
    try:
        text = path.read_text().strip()
    except (OSError, UnicodeDecodeError) as exc:
        raise HostFactUnreadable(path, getattr(exc, "strerror", None) or str(exc)) from exc
    if not text:
        raise HostFactUnreadable(path, "it is empty")
    return text


@dataclass(frozen=True)
class RunningHost:
    """What modstage knows of the host it runs on: the running kernel's ``release``, this
    boot's ``boot_id`` (each None when unreadable, the reason kept) and whether the root is
    a ``sandboxed`` one (any ``--root`` other than ``/``: nothing is loaded or rebooted)."""

    release: str | None
    boot_id: str | None
    sandboxed: bool
    release_error: HostFactUnreadable | None = field(default=None, compare=False, repr=False)
    boot_id_error: HostFactUnreadable | None = field(default=None, compare=False, repr=False)

    @classmethod
    def read(cls, layout: Layout) -> RunningHost:
        """The facts under ``layout``'s root, each read once (the module docstring's rule)."""
        release, release_error = _attempt(layout.os_release)
        boot_id, boot_id_error = _attempt(layout.boot_id)
        sandboxed = not is_host_root(layout.root)
        return cls(release, boot_id, sandboxed, release_error, boot_id_error)

    def need_release(self) -> str:
        """The running kernel's release; :class:`~service.errors.HostFactUnreadable` when
        it could not be read."""
        if self.release is None:
            raise _again(self.release_error, "osrelease")
        return self.release

    def need_boot_id(self) -> str:
        """This boot's id; :class:`~service.errors.HostFactUnreadable` when it could not be
        read."""
        if self.boot_id is None:
            raise _again(self.boot_id_error, "boot_id")
        return self.boot_id


def _attempt(path: Path) -> tuple[str | None, HostFactUnreadable | None]:
    """:func:`read_fact`'s value, or None and why."""
    try:
        return read_fact(path), None
    except HostFactUnreadable as exc:
        return None, exc


def _again(error: HostFactUnreadable | None, name: str) -> HostFactUnreadable:
    """A fresh error for each caller that needs the fact (one snapshot, many raises)."""
    if error is None:  # a snapshot built by hand with the fact left out
        return HostFactUnreadable(name, "not given")
    return HostFactUnreadable(error.path, error.reason)

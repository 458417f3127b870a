"""Once per boot: the record that this boot's one chance to load modules has been taken.

``modstage boot`` loads modules early in a boot, before anything that may use a driver
runs; later in the same boot a load would be a live load (a driver in use, another
version already loaded). So the first of these in a boot closes the boot's window, in
``/var/lib/modstage/boot-window.json`` (the boot id, who closed it, when), written through
the one crash-safe write under the state lock:

- ``modstage boot`` itself, before it touches anything (a boot killed half-way counts:
  the next boot takes it over through the attempt counters);
- the daemon when it starts and no boot ran before it in this boot (a fresh node whose
  boot unit was skipped for want of state, a boot unit disabled or masked). The daemon
  takes no drop in until the record names this boot (:func:`close_for_daemon`).

A run of ``modstage boot`` in a boot whose window is closed changes nothing and says so,
unless the admin asks for a live load by name (``--force-live-load``). ``state.json``'s
boot id is read too: a boot that saved it ran in this boot even if its record could not
be written. The record persists across reboots (clearing ``/run`` cannot reopen a boot's
window); its boot id keeps it from going stale, a new boot id opens the window again.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass

from service.host.running import RunningHost
from service.layout import Layout
from stager.schema.atomic import write_atomic

BOOT = "boot"
DAEMON = "daemon"
WHO = {BOOT: "modstage boot ran", DAEMON: "the daemon started before any modstage boot"}


@dataclass(frozen=True)
class Closed:
    """This boot's window closed: by ``boot`` or ``daemon``, at ``at`` (epoch seconds;
    None when known from ``state.json`` alone or from an unreadable record)."""

    boot_id: str
    by: str
    at: float | None

    def sentence(self) -> str:
        """What an admin reads: who closed the window, and when."""
        when = "" if self.at is None else f" at {_time(self.at)}"
        return f"{WHO.get(self.by, self.by)} in this boot{when} (boot id {self.boot_id})"


def _time(at: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S %Z", time.localtime(at))


class _Unreadable(Exception):
    """The record is there but cannot be read or makes no sense."""


def _recorded(layout: Layout) -> Closed | None:
    """The record as written (None: there is none); raises :class:`_Unreadable`."""
    try:
        raw = layout.boot_window.read_bytes()
    except (FileNotFoundError, NotADirectoryError):
        return None
    except OSError as exc:
        raise _Unreadable(str(exc)) from exc
    try:
        doc = json.loads(raw)
        recorded, by, at = doc["boot_id"], doc["by"], doc["at"]
        if not isinstance(recorded, str) or not isinstance(by, str):
            raise TypeError("boot_id and by must be strings")
        return Closed(recorded, by, float(at) if at is not None else None)
    except (ValueError, KeyError, TypeError) as exc:
        raise _Unreadable(str(exc)) from exc


def current(layout: Layout) -> str:
    """This boot's id; OSError when it cannot be read or is empty (nothing then loads)."""
    return RunningHost.read(layout).need_boot_id()


def written_this_boot(layout: Layout) -> bool:
    """Whether the record's file was last written after this boot began (its mtime against
    ``CLOCK_BOOTTIME``); True when that cannot be told."""
    try:
        began = time.time() - time.clock_gettime(time.CLOCK_BOOTTIME)
        return layout.boot_window.stat().st_mtime >= began
    except OSError:
        return True


def closed(layout: Layout, boot_id: str) -> Closed | None:
    """The record that boot ``boot_id``'s window is closed, or None (it is open).

    An unreadable or malformed record written in this boot counts as closed by ``boot`` (a
    record nobody can read must never lead to a live load); one last written before this
    boot began, like a record of another boot, counts as absent (it must never keep a
    real boot from loading).
    """
    try:
        found = _recorded(layout)
    except _Unreadable:
        if written_this_boot(layout):
            return Closed(boot_id, BOOT, None)
        found = None
    if found is not None and found.boot_id == boot_id:
        return found
    return _from_state(layout, boot_id)


def _from_state(layout: Layout, boot_id: str) -> Closed | None:
    """Closed by ``boot`` if ``state.json`` records this boot's id (only the boot writes
    it, and a rebuild keeps it), else None. An unreadable state says nothing here: the
    boot reports it itself."""
    try:
        doc = json.loads(layout.state.read_bytes())
    except (OSError, ValueError):
        return None
    if isinstance(doc, dict) and doc.get("boot_id") == boot_id:
        return Closed(boot_id, BOOT, None)
    return None


def close(layout: Layout, boot_id: str, by: str, at: float) -> None:
    """Record that boot ``boot_id``'s window is closed (durably: the one atomic write).

    The caller holds the state lock. Raises OSError when it cannot be written; the
    caller decides what that costs.
    """
    layout.boot_window.parent.mkdir(parents=True, exist_ok=True)
    doc = {"boot_id": boot_id, "by": by, "at": round(at, 3)}
    write_atomic(layout.boot_window, (json.dumps(doc, sort_keys=True) + "\n").encode())


def close_for_daemon(layout: Layout, at: float) -> tuple[Closed, bool]:
    """Make this boot's window closed in the record, as the daemon must before it takes
    any drop in: the closed window, and whether the daemon closed it now.

    A boot known only from ``state.json`` or from an unreadable record is written down
    as the boot's. Raises OSError when the boot id or the record cannot be read or
    written: the window is then not closed durably and the daemon takes nothing in.
    """
    from service.bundles.statefile import locked

    boot_id = current(layout)
    with locked(layout.var):
        before = closed(layout, boot_id)
        try:
            as_written = _recorded(layout)
        except _Unreadable:
            as_written = None
        if before is not None and as_written == before:
            return before, False
        now = Closed(boot_id, DAEMON, at) if before is None else before
        close(layout, boot_id, now.by, at if now.at is None else now.at)
        return now, before is None


def boot_ran(layout: Layout) -> str | None:
    """This boot's id if ``modstage boot`` closed its window (what a state rebuilt in
    this boot keeps as its boot id), else None (also when the boot id cannot be read: the
    rebuild goes on without it)."""
    try:
        boot_id = current(layout)
    except OSError:
        return None
    found = closed(layout, boot_id)
    return boot_id if found is not None and found.by == BOOT else None

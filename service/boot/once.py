"""Once per boot: the record that this boot's one chance to load modules has been taken.

``modstage boot`` loads modules early in a boot, before anything that may use a driver
runs; later in the same boot a load would be a live load (a driver in use, another
version already loaded). So the first of these in a boot closes the boot's window, in
``/run/modstage/boot-window.json`` (the boot id, who closed it, when):

- ``modstage boot`` itself, before it touches anything (a boot killed half-way counts:
  the next boot takes it over through the attempt counters);
- the daemon when it starts and no boot ran before it in this boot (a fresh node whose
  boot unit was skipped for want of state, a boot unit disabled or masked).

A run of ``modstage boot`` in a boot whose window is closed changes nothing and says so,
unless the admin asks for a live load by name (``--force-live-load``). ``state.json``'s
boot id is read too: a boot that saved it ran in this boot even if ``/run`` lost the
record. The record lives in ``/run`` (gone at every reboot); the boot id in it makes a
``/run`` that persists (a sandbox's) just as safe.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from service.layout import Layout
from stager.atomic import write_atomic

BOOT = "boot"
DAEMON = "daemon"
WHO = {BOOT: "modstage boot ran", DAEMON: "the daemon started before any modstage boot"}


@dataclass(frozen=True)
class Closed:
    """This boot's window closed: by ``boot`` or ``daemon``, at ``at`` (epoch seconds;
    None when known from ``state.json`` alone)."""

    boot_id: str
    by: str
    at: float | None

    def sentence(self) -> str:
        """What an admin reads: who closed the window, and when."""
        when = "" if self.at is None else f" at {_time(self.at)}"
        return f"{WHO.get(self.by, self.by)} in this boot{when} (boot id {self.boot_id})"


def _time(at: float) -> str:
    import time

    return time.strftime("%Y-%m-%d %H:%M:%S %Z", time.localtime(at))


def closed(layout: Layout, boot_id: str) -> Closed | None:
    """The record that boot ``boot_id``'s window is closed, or None (it is open).

    An unreadable or malformed record counts as closed by ``boot`` (a record nobody can
    read must never lead to a live load); a record of another boot counts as absent.
    """
    try:
        raw = layout.boot_window.read_bytes()
    except (FileNotFoundError, NotADirectoryError):  # no record (no /run/modstage yet)
        return _from_state(layout, boot_id)
    except OSError:
        return Closed(boot_id, BOOT, None)
    try:
        doc = json.loads(raw)
        recorded, by, at = doc["boot_id"], doc["by"], doc["at"]
        if not isinstance(recorded, str) or not isinstance(by, str):
            raise TypeError("boot_id and by must be strings")
        when = float(at) if at is not None else None
    except (ValueError, KeyError, TypeError):
        return Closed(boot_id, BOOT, None)
    if recorded == boot_id:
        return Closed(boot_id, by, when)
    return _from_state(layout, boot_id)


def _from_state(layout: Layout, boot_id: str) -> Closed | None:
    """Closed by ``boot`` if ``state.json`` records this boot's id (only the boot writes
    it), else None. An unreadable state says nothing here: the boot reports it itself."""
    try:
        doc = json.loads(layout.state.read_bytes())
    except (OSError, ValueError):
        return None
    if isinstance(doc, dict) and doc.get("boot_id") == boot_id:
        return Closed(boot_id, BOOT, None)
    return None


def close(layout: Layout, boot_id: str, by: str, at: float) -> None:
    """Record that boot ``boot_id``'s window is closed (durably: the one atomic write).

    Raises OSError when it cannot be written; the caller decides what that costs.
    """
    layout.boot_window.parent.mkdir(parents=True, exist_ok=True)
    doc = {"boot_id": boot_id, "by": by, "at": round(at, 3)}
    write_atomic(layout.boot_window, (json.dumps(doc, sort_keys=True) + "\n").encode())

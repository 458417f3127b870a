"""The child process that takes drops in for the daemon: ``python -m service.cmd.intake_child``.

The daemon stays small by never importing the verification stack (``service.verify``,
OpenSSL's hashlib, cryptography for EC keys): it runs this module instead, once per scan that finds
work (:mod:`service.daemon.intake_runner`). This process builds its
:class:`~service.intake.scan.Intake` through the same :class:`~service.cmd.host.Host` as
``modstage intake``, takes the same state
lock and runs it over every complete drop once it reads its go on standard input: one
JSON line, ``{"stuck": {drop: why}}`` (the drops that could not be removed, which the
daemon remembers across scans as an in-process intake would); end of input instead
means "not needed" (a child started early for a drop that went away), and it exits.
Its standard output is the protocol, one line each: ``tick`` while it makes progress
(the daemon feeds systemd's watchdog on it), ``building "<drop>"`` and ``building null``
around the copy and verification of each drop (if the child is killed in between, by
the out-of-memory killer at the unit's ``MemoryMax=``, the daemon rejects that drop),
then one JSON object, a
:class:`~service.daemon.intake_protocol.ChildResult`. Logs go to standard
error, which it shares with the daemon (journald).

SIGTERM and SIGINT are ignored: a stopping daemon lets the drop being taken in
finish, as it did when intake ran in its own process. SIGKILL is crash-safe as ever.
"""

from __future__ import annotations

import argparse
import json
import signal
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import replace
from pathlib import Path
from typing import BinaryIO

from service.cmd.host import Host
from service.daemon.intake_protocol import TICK, ChildResult, building
from service.errors import ServiceError
from service.layout import Layout
from service.logs import configure
from stager.schema.shown import shown

TICK_EVERY = 0.1  # seconds between two progress lines (the daemon pings at most every ping/2)


def ticker(out: BinaryIO, every: float = TICK_EVERY) -> Callable[[], None]:
    """A tick for :class:`Intake` that writes :data:`TICK` to ``out`` at most every ``every`` s."""
    last = [float("-inf")]

    def tick() -> None:
        now = time.monotonic()
        if now - last[0] >= every:
            last[0] = now
            out.write(TICK)
            out.flush()

    return tick


def announcer(out: BinaryIO) -> Callable[[Path | None], None]:
    """Intake's ``building`` hook: each drop it starts and stops building, told at once."""

    def announce(drop: Path | None) -> None:
        out.write(building(None if drop is None else str(drop)))
        out.flush()

    return announce


def take(layout: Layout, out: BinaryIO, stuck: dict[str, str]) -> ChildResult:
    """Run intake over every complete drop, skipping the ``stuck`` ones the daemon
    remembers; the result (with the drops stuck now)."""
    intake = replace(Host(layout).intake, tick=ticker(out), stuck=stuck, building=announcer(out))
    try:
        outcomes = intake.run()
    except (ServiceError, OSError) as exc:
        return ChildResult.failed(exc, shown(exc))
    return ChildResult(tuple(outcomes), dict(intake.stuck))


def read_stuck(line: bytes) -> dict[str, str]:
    """The daemon's remembered stuck drops from its go line (none if it is not JSON)."""
    try:
        doc = json.loads(line)
        return {str(k): str(v) for k, v in dict(doc.get("stuck", {})).items()}
    except (ValueError, TypeError, AttributeError):
        return {}


def main(argv: Sequence[str] | None = None) -> int:
    """Take drops in under ``--root``; print the result line; 0 unless the run failed."""
    parser = argparse.ArgumentParser(prog="modstage-intake-child")
    parser.add_argument("--root", type=Path, required=True)
    args = parser.parse_args(argv)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    configure()
    go = sys.stdin.buffer.readline()  # a child started early waits here for its go
    if not go:
        return 0  # the daemon let it go unused: nothing to do
    out = sys.stdout.buffer
    try:
        result = take(Layout(args.root), out, read_stuck(go))
    except (ServiceError, OSError) as exc:  # the config or trust store could not be read
        result = ChildResult.failed(exc, shown(exc))
    out.write(json.dumps(result.to_json()).encode() + b"\n")
    out.flush()
    return 0 if result.error is None else 1


if __name__ == "__main__":
    sys.exit(main())

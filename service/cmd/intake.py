"""``modstage intake``: take complete drops into the store as pending generations.

``intake PATH`` takes only what the daemon would: an entry of an incoming
directory (``incoming_dirs`` in config.toml) whose name is a drop's name.
Anything else (the state directory, the store, a file elsewhere) is refused
before anything is read or removed. A drop that waits (its bundle held, an admin's
rollback pending, its target kernel not installed yet) is deferred, not failed: exit 0.
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path
from typing import TextIO

from service.cmd.host import Host
from service.errors import ServiceError, UsageError
from service.intake.scan import Outcome
from service.layout import Layout
from service.publish.operator import incoming_dirs
from stager.schema.paths import parse_drop_name
from stager.schema.shown import MAX_REASON, shown


def drop_path(given: Path, incoming: list[Path]) -> Path:
    """``given`` as an entry of an incoming directory, or :class:`UsageError` saying why.

    The entry itself is not resolved (it may be a planted symlink: intake refuses
    it as a drop); its directory must be one of ``incoming``, the directories the
    daemon takes drops from (:func:`~service.publish.operator.incoming_dirs`).
    """
    absolute = Path(os.path.abspath(given))
    if parse_drop_name(absolute.name) is None:
        raise UsageError(
            f"{shown(given)}: not a drop (a drop is named <bundle>.<time>.<token> "
            "inside an incoming directory)"
        )
    parent = absolute.parent.resolve()
    allowed = [d.resolve() for d in incoming]
    if parent not in allowed:
        where = ", ".join(str(d) for d in incoming)
        raise UsageError(f"{shown(given)}: not in an incoming directory ({where})")
    return parent / absolute.name


def line(o: Outcome) -> str:
    """One line of output for an outcome; untrusted text escaped and bounded."""
    name = shown(o.drop.name)
    if o.accepted:
        return f"{name}: pending {o.bundle} generation {o.generation}"
    reasons = "; ".join(shown(r, MAX_REASON) for r in o.reasons)
    if o.gone:
        return f"{name}: {reasons}"
    if o.waiting:
        return f"{name}: deferred (drop kept, waiting): {reasons}"
    if o.deferred:
        return f"{name}: deferred (drop kept): {reasons}"
    return f"{name}: rejected: {reasons}"


def run(args: argparse.Namespace, out: TextIO) -> int:
    """Take in the given drops (or all); exit 1 if any was rejected or the host failed to
    take it in (the drop kept), 0 when the rest were accepted or wait (deferred: a hold, an
    admin's pending rollback, the target kernel not installed yet): waiting is no failure."""
    layout = Layout(args.root)
    host = Host(layout)
    drops = [drop_path(d, incoming_dirs(layout, host.config)) for d in args.drops]
    try:
        outcomes = host.intake.run(drops or None)
    except OSError as exc:  # the host's own failure (a full disk): a message, no traceback
        raise ServiceError(f"{exc.filename or layout.var}: {exc.strerror or exc}") from exc
    for o in outcomes:
        print(line(o), file=out)
    return 0 if all(o.accepted or o.gone or o.waiting for o in outcomes) else 1

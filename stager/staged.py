"""The last drop staged for a bundle, as ``modstage wait`` finds it without ``--drop``.

``modstage stage`` notes the drop it wrote in a small file of this container (under
``$MODSTAGE_STAGED_DIR``, else ``<tmp>/modstage-<uid>/``), one per bundle and incoming
directory: its real path, so the note is tied to the incoming directory it was staged into
and a stage into another directory (a sandbox's) never replaces it. ``wait --bundle``
alone waits for the newest drop it can see in the incoming directory beside the status directory
(``<status-dir>/../incoming``, as both ``/var/lib/modstage`` and the GPU operator's
``/run/nvidia/modstage`` lay them out): a complete drop of the bundle still there, or the
note of a drop staged into that directory (a note for another directory is ignored). So a
``wait`` after a ``stage`` never answers for a generation older than that drop;
:mod:`stager.wait` drops a note the host has moved past (:func:`stager.wait.superseded`).
"""

from __future__ import annotations

import os
import stat
import tempfile
from dataclasses import dataclass
from pathlib import Path

from stager.schema.atomic import write_atomic
from stager.schema.paths import MANIFEST_NAME, parse_drop_name

STAGED_DIR_ENV = "MODSTAGE_STAGED_DIR"


def notes_dir() -> Path:
    """Where this container's notes live: ``$MODSTAGE_STAGED_DIR`` or a per-user tmp dir."""
    named = os.environ.get(STAGED_DIR_ENV)
    if named:
        return Path(named)
    return Path(tempfile.gettempdir()) / f"modstage-{os.getuid()}"


def _own_dir(path: Path, create: bool) -> bool:
    """``path`` is a directory of this user that nobody else may write (made if asked)."""
    if create:
        try:
            path.mkdir(mode=0o700, parents=True, exist_ok=True)
        except OSError:
            return False
    try:
        st = os.lstat(path)
    except OSError:
        return False
    return stat.S_ISDIR(st.st_mode) and st.st_uid == os.getuid() and not st.st_mode & 0o022


def remember(drop: Path, generation: str) -> None:
    """Note ``drop`` (and its generation) as the last one staged for its bundle; best effort:
    a container without a writable tmp still stages (``wait --drop`` is the explicit form).
    The note holds the drop's real path, so it names the incoming directory it went to."""
    named = parse_drop_name(drop.name)
    directory = notes_dir()
    if named is None or not _own_dir(directory, create=True):
        return
    real = Path(os.path.realpath(drop))
    note = directory / _note_name(named[0], real.parent)
    try:
        write_atomic(note, f"{real}\n{generation}\n".encode())
    except OSError:
        return


def _note_name(bundle: str, incoming: Path) -> str:
    """The note's file name: per bundle and per incoming directory (its real path), so a
    stage into a sandbox never replaces the note of a stage into the host's directory."""
    import hashlib

    where = hashlib.sha256(os.fsencode(incoming)).hexdigest()[:16]
    return f"{bundle}.{where}.last-drop"


@dataclass(frozen=True)
class Seen:
    """A drop ``wait`` may wait for: its path, its generation if known, and whether it is
    still complete in the incoming directory (else the host took it in, or removed it)."""

    drop: Path
    generation: str | None
    in_incoming: bool


def last_drop(bundle: str, status_dir: Path) -> Seen | None:
    """The newest drop of ``bundle`` this container can see in the incoming directory beside
    ``status_dir``: the note of the last ``stage`` into that directory (a note of a drop
    staged into another directory is ignored), or a complete drop still there."""
    incoming = status_dir.parent / "incoming"
    found: list[tuple[str, Seen]] = []
    in_incoming: set[str] = set()
    try:
        entries = list(incoming.iterdir())
    except OSError:
        entries = []
    for entry in entries:
        named = parse_drop_name(entry.name)
        if named is not None and named[0] == bundle and (entry / MANIFEST_NAME).is_file():
            in_incoming.add(entry.name)
            found.append((named[1], Seen(entry, None, True)))
    noted = _note(bundle, Path(os.path.realpath(incoming)))
    if noted is not None:
        drop, generation = noted
        key = parse_drop_name(drop.name)
        assert key is not None
        found.insert(0, (key[1], Seen(drop, generation, drop.name in in_incoming)))
    if not found:
        return None
    return max(found, key=lambda item: item[0])[1]


def _note(bundle: str, incoming: Path) -> tuple[Path, str | None] | None:
    """The noted last drop of ``bundle`` and its generation, if it went into ``incoming``."""
    note = notes_dir() / _note_name(bundle, incoming)
    if not _own_dir(note.parent, create=False):
        return None
    try:
        lines = note.read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError):
        return None
    if len(lines) != 2:
        return None
    drop = Path(lines[0])
    named = parse_drop_name(drop.name)
    if named is None or named[0] != bundle or drop.parent != incoming:
        return None
    return drop, lines[1] or None

"""The last drop staged for a bundle, as ``modstage wait`` finds it without ``--drop``.

``modstage stage`` notes the drop it wrote in a small file of this container (under
``$MODSTAGE_STAGED_DIR``, else ``<tmp>/modstage-<uid>/``), and ``wait --bundle`` alone
waits for the newest drop it can see: that note, or a complete drop of the bundle still in
the incoming directory beside the status directory (``<status-dir>/../incoming``, as both
``/var/lib/modstage`` and the GPU operator's ``/run/nvidia/modstage`` lay them out). So a
``wait`` after a ``stage`` never answers for a generation older than that drop.
"""

from __future__ import annotations

import os
import stat
import tempfile
from pathlib import Path

from stager.atomic import write_atomic
from stager.paths import MANIFEST_NAME, parse_drop_name

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
    a container without a writable tmp still stages (``wait --drop`` is the explicit form)."""
    named = parse_drop_name(drop.name)
    directory = notes_dir()
    if named is None or not _own_dir(directory, create=True):
        return
    try:
        write_atomic(directory / f"{named[0]}.last-drop", f"{drop}\n{generation}\n".encode())
    except OSError:
        return


def last_drop(bundle: str, status_dir: Path) -> tuple[Path, str | None] | None:
    """The newest drop of ``bundle`` this container can see, with its generation if known."""
    found: list[tuple[str, Path, str | None]] = []
    note = notes_dir() / f"{bundle}.last-drop"
    if _own_dir(note.parent, create=False):
        try:
            lines = note.read_text(encoding="utf-8").splitlines()
        except (OSError, UnicodeDecodeError):
            lines = []
        named = parse_drop_name(Path(lines[0]).name) if len(lines) == 2 else None
        if named is not None and named[0] == bundle:
            found.append((named[1], Path(lines[0]), lines[1] or None))
    incoming = status_dir.parent / "incoming"
    try:
        entries = list(incoming.iterdir())
    except OSError:
        entries = []
    for entry in entries:
        named = parse_drop_name(entry.name)
        if named is not None and named[0] == bundle and (entry / MANIFEST_NAME).is_file():
            found.append((named[1], entry, None))
    if not found:
        return None
    _key, drop, generation = max(found, key=lambda item: item[0])
    return drop, generation

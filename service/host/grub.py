"""grub's menu and environment as grub itself reads them: which entry its default names.

grub-mkconfig writes ``/boot/grub/grub.cfg``; its header (``/etc/grub.d/00_header``) loads
``/boot/grub/grubenv`` and sets ``default`` to the one-time ``next_entry`` when that is set
(``grub-reboot``), else to ``GRUB_DEFAULT`` (``${saved_entry}`` for ``GRUB_DEFAULT=saved``,
set by ``grub-set-default``). A default names an entry as grub's ``get_entry_number``
(grub-core/normal/menu.c) resolves it: a number (an index among the entries of one menu, a
submenu counting as one), a title or a ``--id``, and a ``>``-joined path through submenus
(``1>2``, ``Advanced options for Debian GNU/Linux>Debian GNU/Linux, with Linux 6.1.0-50-amd64``;
``>>`` is a literal ``>``). Where it names no entry of a menu level grub boots that level's
first entry, and a submenu it names boots the submenu's first entry (:func:`resolve`). A
menu entry's kernel is the ``vmlinuz-<release>`` of its ``linux`` line.

This is a reader of what grub-mkconfig writes, not a grub script interpreter: lines it does
not know are ignored, and nothing here raises on a hostile file; the files are read capped
(:data:`MAX_CFG_BYTES`, :data:`MAX_ENV_BYTES`), only when regular.
"""

from __future__ import annotations

import os
import shlex
import stat
from dataclasses import dataclass, field
from pathlib import PurePosixPath

MAX_CFG_BYTES = 1 << 20  # Debian's grub.cfg is about 8 KiB, 2 KiB more per kernel
MAX_ENV_BYTES = 64 << 10  # grubenv is one 1,024-byte block
ENV_SIGNATURE = b"# GRUB Environment Block\n"
NEXT_ENTRY = "${next_entry}"
SAVED_ENTRY = "${saved_entry}"
_LINUX = ("linux", "linuxefi", "linux16")
MAX_DEPTH = 64  # nested blocks kept; deeper ones are counted only


class Unreadable(Exception):
    """A grub file exists but cannot be read as one; the message says why."""


def read_capped(path: os.PathLike[str] | str, cap: int) -> bytes | None:
    """The bytes of regular file ``path`` (None: it does not exist). Raises
    :class:`Unreadable` for anything else: not a regular file (never blocks on a FIFO), over
    ``cap`` bytes, an I/O error."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise Unreadable(f"{path}: cannot open: {exc.strerror}") from exc
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise Unreadable(f"{path}: not a regular file")
        data = os.read(fd, cap + 1)
        chunk = data
        while chunk and len(data) <= cap:
            chunk = os.read(fd, cap + 1 - len(data))
            data += chunk
    except OSError as exc:
        raise Unreadable(f"{path}: cannot read: {exc.strerror}") from exc
    finally:
        os.close(fd)
    if len(data) > cap:
        raise Unreadable(f"{path}: larger than {cap} bytes")
    return data


@dataclass(frozen=True)
class Entry:
    """One ``menuentry`` (``children`` None) or ``submenu`` of grub.cfg."""

    title: str
    id: str | None = None
    release: str | None = None  # of its first linux line's vmlinuz-<release>; None: no such
    children: tuple[Entry, ...] | None = None


@dataclass(frozen=True)
class Assignment:
    """One top-level ``set default=VALUE``; ``when_next_entry`` is the branch of grub's
    ``if [ "${next_entry}" ]`` it sits in (None: outside one)."""

    value: str
    when_next_entry: bool | None = None


@dataclass(frozen=True)
class Menu:
    """What of grub.cfg decides the default: its entries and its ``set default`` lines."""

    entries: tuple[Entry, ...] = ()
    defaults: tuple[Assignment, ...] = ()

    def default(self, next_entry: str) -> str:
        """The value ``default`` has once the script ran, given grubenv's ``next_entry``
        ('' when unset); '' when nothing sets it (grub then boots the first entry)."""
        value = ""
        for a in self.defaults:
            if a.when_next_entry is None or a.when_next_entry == bool(next_entry):
                value = a.value
        return value


def _words(line: str) -> list[str] | None:
    """A line split as the grub shell splits it (close enough: POSIX quoting); None when
    its quoting is broken."""
    try:
        return shlex.split(line, comments=False, posix=True)
    except ValueError:
        return None


def _menu_head(words: list[str]) -> tuple[str, str | None] | None:
    """(title, id) of a ``menuentry``/``submenu`` line's words (the ``{`` taken off)."""
    if len(words) < 2:
        return None
    ident = None
    for i, word in enumerate(words[2:], 2):
        if word in ("$menuentry_id_option", "--id") and i + 1 < len(words):
            ident = words[i + 1]
        elif word.startswith("--id="):
            ident = word.removeprefix("--id=")
    return words[1], ident


def _release(words: list[str]) -> str | None:
    """The release of a ``linux /boot/vmlinuz-<release> ...`` line's image, if named so."""
    if len(words) < 2:
        return None
    name = PurePosixPath(words[1]).name
    return name.removeprefix("vmlinuz-") if name.startswith("vmlinuz-") else None


@dataclass
class _Frame:
    kind: str  # "menuentry", "submenu" or "other" (a function, a block not understood)
    title: str = ""
    id: str | None = None
    release: str | None = None
    children: list[Entry] = field(default_factory=list)

    def entry(self) -> Entry:
        if self.kind == "submenu":
            return Entry(self.title, self.id, None, tuple(self.children))
        return Entry(self.title, self.id, self.release)


def parse_menu(text: str) -> Menu:
    """The entries and default assignments of grub.cfg's ``text``; what is not understood
    is skipped."""
    stack: list[_Frame] = []
    top: list[Entry] = []
    defaults: list[Assignment] = []
    conds: list[bool | None] = []  # per open `if`: True in a next_entry test's then branch
    deeper = 0  # blocks opened beyond MAX_DEPTH: counted, not kept
    for raw in text.splitlines():
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        first = line.split(None, 1)[0]
        if line == "}":
            if deeper:
                deeper -= 1
            elif stack:
                frame = stack.pop()
                if frame.kind != "other":
                    (stack[-1].children if stack else top).append(frame.entry())
            continue
        if line.endswith("{"):
            if len(stack) >= MAX_DEPTH:
                deeper += 1
                continue
            words = _words(line[:-1]) if first in ("menuentry", "submenu") else None
            head = _menu_head(words) if words else None
            stack.append(_Frame(first, *head) if words and head else _Frame("other"))
            continue
        if stack:
            frame = stack[-1]
            if frame.kind == "menuentry" and frame.release is None and first in _LINUX:
                frame.release = _release(_words(line) or [])
            continue
        _top_level(line, first, conds, defaults)
    return Menu(tuple(top), tuple(defaults))


def _top_level(line: str, first: str, conds: list[bool | None], defaults: list[Assignment]) -> None:
    """Track ``if [ "${next_entry}" ]``, ``else``, ``fi`` and record ``set default=``; only
    those lines are split (shlex is the slow part)."""
    if first == "if":
        words = _words(line) if NEXT_ENTRY in line else None
        conds.append(True if words and words[1:4] == ["[", NEXT_ENTRY, "]"] else None)
    elif first == "else" and conds:
        conds[-1] = None if conds[-1] is None else not conds[-1]
    elif first == "fi" and conds:
        conds.pop()
    elif first == "set" and "default=" in line:
        words = _words(line)
        if words and len(words) == 2 and words[1].startswith("default="):
            guard = next((c for c in reversed(conds) if c is not None), None)
            defaults.append(Assignment(words[1].removeprefix("default="), guard))


def _logical_lines(text: str) -> list[str]:
    """grubenv's lines: a backslash escapes the next character, a newline too."""
    lines, start, i = [], 0, 0
    while i < len(text):
        if text[i] == "\\":
            i += 2
            continue
        if text[i] == "\n":
            lines.append(text[start:i])
            start = i + 1
        i += 1
    return [*lines, text[start:]]


def _unescape(text: str) -> str:
    value, i = [], 0
    while i < len(text):
        if text[i] == "\\" and i + 1 < len(text):
            i += 1
        value.append(text[i])
        i += 1
    return "".join(value)


def parse_env(data: bytes) -> dict[str, str]:
    """grubenv's variables (grub-core/lib/envblk.c). A block without grub's signature is
    no block: grub's ``load_env`` refuses it and sets nothing, so neither does this."""
    if not data.startswith(ENV_SIGNATURE):
        return {}
    found: dict[str, str] = {}
    for line in _logical_lines(data[len(ENV_SIGNATURE) :].decode("utf-8", "replace")):
        if not line or line.startswith("#") or "=" not in line:
            continue
        name, _, escaped = line.partition("=")
        found.setdefault(name, _unescape(escaped))
    return found


def _first(ref: str) -> tuple[str, str | None]:
    """``ref``'s first component (``>>`` read as ``>``) and what grub leaves as the
    submenu's default once it runs that entry: the text after the first single ``>``
    (None: there is none, or nothing follows it; grub then unsets ``default``)."""
    part, i = [], 0
    while i < len(ref):
        if ref[i] == ">" and ref[i + 1 : i + 2] == ">":
            part.append(">")
            i += 2
            continue
        if ref[i] == ">":
            return "".join(part), ref[i + 1 :] or None
        part.append(ref[i])
        i += 1
    return "".join(part), None


def _number(text: str) -> int | None:
    """A component read as grub's ``grub_strtoul(val, 0, 0)`` reads it (grub-core/kern/misc.c):
    the digits it starts with, ``0x`` hex, leading-``0`` octal or decimal, the rest
    ignored (``2nd`` is 2); None when it starts with none (grub's ``GRUB_ERR_BAD_NUMBER``:
    then it is a title or an id)."""
    t = text.lower()
    if t.startswith("0x"):
        t, base, digits = t[2:], 16, "0123456789abcdef"
    elif t[1:2] and t[0] == "0" and t[1] in "01234567":
        t, base, digits = t[1:], 8, "01234567"
    else:
        base, digits = 10, "0123456789"
    end = 0
    while end < len(t) and t[end] in digits:
        end += 1
    return int(t[:end], base) if end else None


@dataclass(frozen=True)
class Resolved:
    """The menu entry a default names, with the titles of the submenus on its way;
    ``fallback`` says where grub fell back to a first entry or ignored the rest of the
    path (None: the default named the entry itself)."""

    entry: Entry
    path: tuple[str, ...]  # titles from the top menu down to the entry
    fallback: str | None = None

    @property
    def title(self) -> str:
        """The titles joined as grub joins them in a default (``>``)."""
        return ">".join(t.replace(">", ">>") for t in self.path)


def _pick(level: tuple[Entry, ...], part: str) -> int | None:
    """The index grub's ``get_entry_number`` gives ``part`` in ``level`` (None: none,
    or a number past the menu's end)."""
    index = _number(part)
    if index is None:
        return next((i for i, e in enumerate(level) if part in (e.title, e.id)), None)
    return index if index < len(level) else None


def resolve(entries: tuple[Entry, ...], ref: str) -> Resolved | str:
    """The menu entry grub boots for ``default`` = ``ref``, or why it boots none.

    As grub-core/normal/menu.c does: at each menu level ``run_menu`` takes the entry
    ``get_entry_number`` names, and entry 0 when it names none (``default_entry < 0 ||
    default_entry >= menu->size``); a submenu run as the default (``grub_menu_execute_entry``)
    gets the rest of the ``>`` path as its default, or none (its entry 0) when nothing is
    left; a menu entry named with more of the path after it boots, the rest unread. An empty
    menu boots nothing."""
    level: tuple[Entry, ...] = entries
    path: list[str] = []
    fell: list[str] = []
    rest: str | None = ref
    while True:
        where = f"submenu {path[-1]!r}" if path else "grub.cfg's menu"
        if not level:
            return f"{where} has no entries"
        index = 0
        if rest is not None:
            part, rest = _first(rest)
            picked = _pick(level, part)
            if picked is None:
                fell.append(f"{part!r} names no entry of {where}: grub boots its first entry")
            else:
                index = picked
                if rest is None and level[index].children is not None:
                    fell.append(f"{level[index].title!r} is a submenu: grub boots its first entry")
        found = level[index]
        path.append(found.title)
        if found.children is None:
            if rest is not None:
                fell.append(f"{found.title!r} is a menu entry: grub boots it, ignoring {rest!r}")
            return Resolved(found, tuple(path), "; ".join(fell) or None)
        level = found.children

"""Kernel module parameter strings, parsed the way ``kernel/params.c`` splits them.

A parameter string is what ``finit_module`` receives: ``name=value`` words
separated by spaces, a bare ``name`` for a boolean, double quotes around a value
(or the whole word) that holds spaces, no escapes. modstage accepts only what
the kernel would split into the same words, and nothing that could smuggle
control characters into a log line or a sysfs write.
"""

from __future__ import annotations

import re

MAX_PARAMS_LEN = 4096
_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_-]*\Z")
# lib/ctype.c counts byte 0xA0 (Latin-1 no-break space) as a space, and next_arg splits on
# isspace() outside double quotes; many UTF-8 characters (U+0020..U+FFFF) carry that byte
_KERNEL_ONLY_SPACE = 0xA0


class ParamsError(ValueError):
    """The parameter string is not one the kernel would parse as intended."""


def parse_params(text: str) -> tuple[tuple[str, str | None], ...]:
    """Split ``text`` into ``(name, value)`` pairs; ``value`` is None for a bare name.

    Raises :class:`ParamsError` naming the first problem.
    """
    if len(text.encode()) > MAX_PARAMS_LEN:
        raise ParamsError(f"longer than {MAX_PARAMS_LEN} bytes")
    for ch in text:
        if ch != " " and (not ch.isprintable() or ch.isspace()):
            raise ParamsError(f"contains the control or space character {ch!r}")
    if (split := kernel_space_problem(text)) is not None:
        raise ParamsError(split)
    pairs: list[tuple[str, str | None]] = []
    i, n = 0, len(text)
    while i < n:
        if text[i] == " ":
            i += 1
            continue
        word, i = _next_word(text, i)
        if word.startswith('"') and word.endswith('"') and len(word) >= 2:
            word = word[1:-1]
        name, eq, value = word.partition("=")
        if name == "--":
            raise ParamsError("'--' would end parameter parsing")
        if not _NAME.match(name):
            raise ParamsError(f"{name!r} is not a parameter name")
        if eq and value.startswith('"') and value.endswith('"') and len(value) >= 2:
            value = value[1:-1]
        pairs.append((name, value if eq else None))
    return tuple(pairs)


def kernel_space_problem(text: str) -> str | None:
    """Why the kernel's ``next_arg`` would split ``text`` where it shows no space: an
    unquoted byte 0xA0 of a UTF-8 character (None: it would not). The one check, for
    ``stage`` (through :func:`parse_params`) and for the host's intake alike."""
    in_quote = False
    for at, byte in enumerate(text.encode()):
        if byte == ord('"'):
            in_quote = not in_quote
        elif byte == _KERNEL_ONLY_SPACE and not in_quote:
            return (
                f"byte 0xA0 at offset {at} (part of a UTF-8 character) is a space to the "
                "kernel's parameter parser and would split this value; quote it"
            )
    return None


def _next_word(text: str, i: int) -> tuple[str, int]:
    """One word starting at ``i``: spaces inside double quotes do not end it."""
    quoted = False
    start = i
    while i < len(text) and (quoted or text[i] != " "):
        if text[i] == '"':
            quoted = not quoted
        i += 1
    if quoted:
        raise ParamsError(f"unbalanced double quote in {text[start:i]!r}")
    word = text[start:i]
    if word.count('"') not in (0, 2) or ('"' in word and not _quotes_well_placed(word)):
        raise ParamsError(f"double quotes must surround the value or the word in {word!r}")
    return word, i


def _quotes_well_placed(word: str) -> bool:
    name, _, value = word.partition("=")
    if word.startswith('"') and word.endswith('"'):
        return True
    return '"' not in name and value.startswith('"') and value.endswith('"')


def format_params(pairs: tuple[tuple[str, str | None], ...] | list[tuple[str, str | None]]) -> str:
    """The canonical string for ``pairs``: quotes only where a value holds a space."""
    words = []
    for name, value in pairs:
        if value is None:
            words.append(name)
        elif " " in value or value == "":
            words.append(f'{name}="{value}"')
        else:
            words.append(f"{name}={value}")
    return " ".join(words)


def merge_params(base: str, override: str) -> str:
    """Merge two parameter strings; a name in ``override`` replaces it in ``base``.

    Names compare the way the kernel compares them (``-`` equals ``_``).
    """
    merged: dict[str, tuple[str, str | None]] = {}
    for name, value in parse_params(base) + parse_params(override):
        merged[name.replace("-", "_")] = (name, value)
    return format_params(list(merged.values()))

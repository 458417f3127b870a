"""Module parameter strings as the kernel's ``next_arg`` (kernel/params.c) splits them.

The kernel splits on ``isspace()`` outside double quotes, and its ctype table
(lib/ctype.c) counts byte 0xA0 (Latin-1 no-break space) as a space. A UTF-8 parameter
holding U+00A0, or any character whose encoding contains byte 0xA0 (U+0020..U+FFFF
have many), is therefore cut in two at load time: the value the module gets is not the
one the manifest says. Intake refuses such strings unless the byte is quoted.
"""

from __future__ import annotations

_KERNEL_ONLY_SPACE = 0xA0


def param_problems(params: str) -> list[str]:
    """Why the kernel would split ``params`` differently from what it says; empty if not."""
    in_quote = False
    for at, byte in enumerate(params.encode()):
        if byte == ord('"'):
            in_quote = not in_quote
        elif byte == _KERNEL_ONLY_SPACE and not in_quote:
            return [
                f"EINVAL (policy): byte 0xA0 at offset {at} (part of a UTF-8 character) is a "
                "space to the kernel's parameter parser and would split this value; quote it"
            ]
    return []

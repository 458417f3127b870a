"""Module parameter strings as the kernel's ``next_arg`` (kernel/params.c) splits them.

The kernel splits on ``isspace()`` outside double quotes, and its ctype table
(lib/ctype.c) counts byte 0xA0 (Latin-1 no-break space) as a space. A UTF-8 parameter
holding any character whose encoding contains byte 0xA0 is therefore cut in two at load
time: the value the module gets is not the one the manifest says. Intake refuses such
strings unless the byte is quoted; the check is the container's own
(:func:`stager.schema.params.kernel_space_problem`), so ``stage`` refuses what intake would.
"""

from __future__ import annotations

from stager.schema.params import kernel_space_problem


def param_problems(params: str) -> list[str]:
    """Why the kernel would split ``params`` differently from what it says; empty if not."""
    problem = kernel_space_problem(params)
    return [] if problem is None else [f"EINVAL (policy): {problem}"]

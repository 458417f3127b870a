"""docs/kernel.md's table of the kernel's rules, rendered from
`service.verify.targetkernel.rules.ROWS` (`python3 -m tests.rules_doc` prints it; tests/test_docs.py
checks that the doc holds exactly these lines)."""

from __future__ import annotations

from service.verify.targetkernel.rules import ROWS, Row, Since, Symbol

HEADER = (
    "| rule | mirrors | decided by | unread | knob |",
    "|---|---|---|---|---|",
)


def decided(row: Row) -> str:
    """How the row is decided, in words: its config symbol, or its release and commit."""
    by = row.decided_by
    if isinstance(by, Symbol):
        return f"`CONFIG_{by.symbol}` (y or m)"
    word = "from" if isinstance(by, Since) else "before"
    return f"{word} {by.release[0]}.{by.release[1]}: {by.commit}"


def render() -> list[str]:
    """The table's lines, one per row of the code's table, in its order."""
    lines = list(HEADER)
    for row in ROWS:
        unread = "applies" if row.unreadable else "does not apply"
        mirrors = ", ".join(f"`{name}`" for name in row.mirrors.split(", "))
        cells = (row.rule, mirrors, decided(row), unread, f"`{row.knob}`")
        lines.append("| " + " | ".join(cells) + " |")
    return lines


if __name__ == "__main__":
    print("\n".join(render()))

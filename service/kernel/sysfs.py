"""sysfs under a root: read attributes, list directories, write only when the value differs."""

from __future__ import annotations

from pathlib import Path


class Sysfs:
    """The ``/sys`` tree rooted at ``root`` (a temporary tree in tests)."""

    def __init__(self, root: Path) -> None:
        self.root = root

    def read(self, attribute: str) -> str:
        """The attribute's value without the trailing newline."""
        return (self.root / attribute).read_text().rstrip("\n")

    def has(self, attribute: str) -> bool:
        """Whether the attribute (or directory) exists."""
        return (self.root / attribute).exists()

    def entries(self, directory: str) -> list[str]:
        """The names in a sysfs directory, sorted; none when it is absent."""
        try:
            return sorted(p.name for p in (self.root / directory).iterdir())
        except (FileNotFoundError, NotADirectoryError):
            return []

    def write(self, attribute: str, value: str) -> bool:
        """Write ``value`` if it differs from what is there; return whether it wrote."""
        if self.read(attribute) == value:
            return False
        with open(self.root / attribute, "w") as f:  # one write(2), as sysfs wants
            f.write(value)
        return True

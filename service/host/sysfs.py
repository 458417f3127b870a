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


class RecordingSysfs(Sysfs):
    """The tree at ``root`` read as it is; writes recorded in ``events`` instead of made.

    Later reads see the recorded values, so a caller's decisions run as they would
    after real writes (``modstage boot --dry-run``).
    """

    def __init__(self, root: Path, events: list[tuple[str, ...]]) -> None:
        super().__init__(root)
        self.events = events
        self.written: dict[str, str] = {}

    def read(self, attribute: str) -> str:
        """The recorded value, else the tree's."""
        if attribute in self.written:
            return self.written[attribute]
        return super().read(attribute)

    def write(self, attribute: str, value: str) -> bool:
        """Record ``value`` if it differs from what is there; return whether it would write."""
        if self.read(attribute) == value:
            return False
        self.written[attribute] = value
        self.events.append(("write", attribute, value))
        return True

"""``[limits]``: bounds on what one drop may make the host copy (every key at least 1)."""

from __future__ import annotations

from dataclasses import dataclass, field

from stager.schema.record import spec


def _at_least_one(value: int) -> str | None:
    return None if value >= 1 else f"{value} is not a positive integer"


POSITIVE = spec(check=_at_least_one)  # the metadata of a key that must be at least 1


@dataclass(frozen=True)
class Limits:
    """Bounds on what one drop may make the host copy."""

    max_file_bytes: int = field(default=2 << 30, metadata=POSITIVE)
    max_total_bytes: int = field(default=8 << 30, metadata=POSITIVE)
    max_files: int = field(default=10_000, metadata=POSITIVE)
    # never more than the schema's 1 MiB
    max_manifest_bytes: int = field(default=1 << 20, metadata=POSITIVE)
    # entries of a drop's tree removed or measured
    max_tree_entries: int = field(default=100_000, metadata=POSITIVE)
    # wall time one drop may take to be taken in
    max_seconds: int = field(default=600, metadata=POSITIVE)
    # what one drop's modules expand to, together
    max_decompressed_bytes: int = field(default=1 << 30, metadata=POSITIVE)
    # rejected drops kept for an admin, and the bytes they may hold together
    quarantine_drops: int = field(default=16, metadata=POSITIVE)
    quarantine_bytes: int = field(default=256 << 20, metadata=POSITIVE)

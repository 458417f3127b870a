"""The ``modstage stage`` command line the stager tests run, written once."""

from __future__ import annotations

from pathlib import Path


def stage_argv(
    into: Path, *extra: str, bundle: str = "nvidia", version: str = "1", kernel: str = "6.1"
) -> list[str]:
    """``stage --into INTO --bundle --version --kernel`` followed by ``extra``."""
    return [
        "stage",
        "--into",
        str(into),
        "--bundle",
        bundle,
        "--version",
        version,
        "--kernel",
        kernel,
        *extra,
    ]


def module_bytes(size: int = 256, fill: bytes = b"\0") -> bytes:
    """A file ``stage`` takes for a module: an ELF64 relocatable header (as every ``.ko`` has),
    padded to ``size`` bytes with ``fill``; not loadable, and tests that stage never load."""
    header = (
        b"\x7fELF\x02\x01\x01" + b"\0" * 9 + (1).to_bytes(2, "little") + (62).to_bytes(2, "little")
    )
    left = max(0, size - len(header))
    body = (fill * (left // max(1, len(fill)) + 1))[:left]
    return header + body

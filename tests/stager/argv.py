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

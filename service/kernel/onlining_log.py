"""What memory onlining did, logged the same way at boot and in the daemon."""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from service.logs import get_logger

log = get_logger("modstage.memory")


def log_onlining(done: Iterable[Mapping[str, object]]) -> None:
    """Log each step of an onlining pass: ``memory.onlined``, or ``memory.online_failed``
    for a block the kernel refused (the step carries its ``error``)."""
    for step in done:
        if "error" in step:
            log.error("memory.online_failed", **step)
        else:
            log.info("memory.onlined", **step)

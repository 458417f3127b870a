"""What memory onlining did, logged the same way at boot and in the daemon."""

from __future__ import annotations

from collections.abc import Iterable

from service.kernel.memory import Onlined
from service.logs import get_logger

log = get_logger("modstage.memory")


def log_onlining(done: Iterable[Onlined]) -> None:
    """Log each step of an onlining pass: ``memory.onlined``, or ``memory.online_failed``
    for a block the kernel refused (the step carries its ``error``)."""
    for step in done:
        if step.error is not None:
            log.error("memory.online_failed", **step.fields())
        else:
            log.info("memory.onlined", **step.fields())

"""What memory onlining did, logged the same way at boot and in the daemon."""

from __future__ import annotations

from collections.abc import Iterable

from service.host.memory import Onlined
from service.logs import get_logger


def log_onlining(done: Iterable[Onlined]) -> None:
    """Log each step of an onlining pass: ``memory.onlined``, or ``memory.online_failed``
    for a block the kernel refused (the step carries its ``error``).

    The logger is taken per pass, not once per process: boot, the dry run and the daemon's
    listener thread share this function, and a logger cached under one configuration
    would keep it after the entry point (or a test) configures logging anew.
    """
    log = get_logger("modstage.memory")
    for step in done:
        if step.error is not None:
            log.error("memory.online_failed", **step.fields())
        else:
            log.info("memory.onlined", **step.fields())

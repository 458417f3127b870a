"""``nvidia-driver prestage``: a precompiled pool's driver staged for the next kernel.

A precompiled pool's images carry one kernel each, and the GPU operator picks a driver pod's
image by the kernel the node runs, so that pod cannot stage for a kernel update the host has
installed: the next kernel's image is another image. A DaemonSet of that image, one per next
kernel and selected by the host's ``<prefix>/kernel.next`` label
(``deploy/kubernetes/nvidia-prestage.yaml``), runs ``nvidia-driver prestage``:

* it reads the host's announcement (``status/_host.json``) at start and every
  ``MODSTAGE_NEXT_KERNEL_EVERY`` seconds; when the next boot runs the image's own kernel
  (``KERNEL_VERSION``), not the running one, and the host has no ``nvidia`` generation of
  this version for it, it stages the image's modules for that kernel, once per kernel
  (:meth:`stager.driver.Driver.next_kernel`). Modules the image carries for other kernels are
  never staged: the digest is the one kernel's;
* its drop carries ``DRIVER_CONFIG_DIGEST``, which in this DaemonSet is the digest the
  operator gives the next kernel's driver pod (a precompiled pool's digest covers its kernel
  and image), so that after the reboot the host publishes it and that pod's init container
  keeps the driver the host loaded. Without it the mode refuses to start;
* a kernel it does not carry, a host refusal and a failure to stage are each said once;
* it never loads or unloads a module, never binds the driver root, never writes the state
  or readiness file (its pod mounts only the host's ``/run/nvidia/modstage``), and sleeps
  until SIGTERM or SIGINT, exiting 0.
"""

from __future__ import annotations

import signal
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TextIO

from stager.driver import Driver, Settings
from stager.errors import StagerError

Stopped = Callable[[float], bool]  # wait up to that many seconds; True once told to stop


def _binds_nothing(argv: Sequence[str]) -> int:
    raise StagerError(f"pre-stage mode mounts nothing (asked: {' '.join(argv)})")


def stop_signals() -> Stopped:
    """A wait that ends early, answering True, on SIGTERM or SIGINT (blocked from now on,
    so one sent between two waits is not lost)."""
    signals = {signal.SIGTERM, signal.SIGINT}
    signal.pthread_sigmask(signal.SIG_BLOCK, signals)
    return lambda seconds: signal.sigtimedwait(signals, seconds) is not None


@dataclass
class Prestage:
    """One pre-stage pod's run: looks at the host's next kernel until told to stop."""

    driver: Driver
    stopped: Stopped
    failures: set[str] = field(default_factory=set)  # failures said, once each

    @classmethod
    def from_environ(
        cls,
        env: Mapping[str, str],
        out: TextIO,
        root: Path = Path("/"),
        stopped: Stopped | None = None,
    ) -> Prestage:
        """The driver image's settings (:meth:`Settings.from_environ`) narrowed to its own
        kernel; ``KERNEL_VERSION`` and ``DRIVER_CONFIG_DIGEST`` are required."""
        if not env.get("KERNEL_VERSION"):
            raise StagerError(
                "KERNEL_VERSION: not set (pre-stage mode stages for the image's own kernel)"
            )
        if not env.get("DRIVER_CONFIG_DIGEST"):
            raise StagerError(
                "DRIVER_CONFIG_DIGEST: not set (set it to the digest the operator gives the "
                "next kernel's driver pod, or that pod's init container unloads the driver "
                "the host loads after the reboot)"
            )
        settings = replace(Settings.from_environ(env, root), modules_root=None)
        driver = Driver(settings, out, mount=_binds_nothing)
        return cls(driver, stopped if stopped is not None else stop_signals())

    def check(self) -> str | None:
        """One look at the host's announcement; the drop staged, if any."""
        try:
            return self.driver.next_kernel()
        except (OSError, StagerError) as exc:
            if str(exc) not in self.failures:
                self.failures.add(str(exc))
                self.driver.say(f"staging for the next kernel failed: {exc}")
            return None

    def run(self) -> int:
        """Look now and every period until told to stop; 0."""
        s = self.driver.settings
        self.driver.say(
            f"pre-stage: nvidia {s.version} for kernel {s.kernel}, staged when the host's "
            "next boot runs it; this pod loads, unloads and binds nothing and is never ready"
        )
        self.check()
        while not self.stopped(s.next_kernel_every):
            self.check()
        self.driver.say("stopping; nothing to undo (pre-stage mode changes only its drop)")
        return 0

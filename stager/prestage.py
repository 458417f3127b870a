"""``nvidia-driver prestage``: a precompiled pool's driver staged for the next kernel.

A precompiled pool's images carry one kernel each, and the GPU operator picks a driver pod's
image by the kernel the node runs, so that pod cannot stage for a kernel update the host has
installed: the next kernel's image is another image. A DaemonSet of that image, one per next
kernel and selected by the host's ``<prefix>/kernel.next`` label
(``deploy/kubernetes/nvidia-prestage.yaml``), runs ``nvidia-driver prestage``:

* it reads the host's announcement (``status/_host.json``) at start and every
  ``MODSTAGE_NEXT_KERNEL_EVERY`` seconds; when the next boot runs the image's own kernel
  (``KERNEL_VERSION``), not the running one, and the host has no ``nvidia`` generation of
  this version for it nor a drop for it waiting to be judged, it stages the image's modules
  for that kernel, once per kernel
  (:meth:`stager.driver.Driver.next_kernel`, narrowed to the image's kernel by
  :func:`stager.driver.prestage`). Modules the image carries for other kernels are
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
from dataclasses import dataclass, field

from stager.schema.failures import StagerError

Stopped = Callable[[float], bool]  # wait up to that many seconds; True once told to stop


def require(env: Mapping[str, str]) -> None:
    """``KERNEL_VERSION`` and ``DRIVER_CONFIG_DIGEST`` are set; else :class:`StagerError`."""
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


def mounts_nothing(argv: Sequence[str]) -> int:
    """The pre-stage pod's mount: there is none (it never binds the driver root)."""
    raise StagerError(f"pre-stage mode mounts nothing (asked: {' '.join(argv)})")


def stop_signals() -> Stopped:
    """A wait that ends early, answering True, on SIGTERM or SIGINT (blocked from now on,
    so one sent between two waits is not lost)."""
    signals = {signal.SIGTERM, signal.SIGINT}
    signal.pthread_sigmask(signal.SIG_BLOCK, signals)
    return lambda seconds: signal.sigtimedwait(signals, seconds) is not None


@dataclass
class Prestage:
    """One pre-stage pod's run: looks at the host's next kernel until told to stop
    (built by :func:`stager.driver.prestage`)."""

    look: Callable[[], str | None]  # one look at the host's announcement; the drop staged
    say: Callable[[str], None]
    what: str  # "nvidia <version> for kernel <release>"
    every: float  # seconds between looks
    stopped: Stopped
    failures: set[str] = field(default_factory=set)  # failures said, once each

    def check(self) -> str | None:
        """One look at the host's announcement; the drop staged, if any."""
        try:
            return self.look()
        except (OSError, StagerError) as exc:
            if str(exc) not in self.failures:
                self.failures.add(str(exc))
                self.say(f"staging for the next kernel failed: {exc}")
            return None

    def run(self) -> int:
        """Look now and every period until told to stop; 0."""
        self.say(
            f"pre-stage: {self.what}, staged when the host's next boot runs it; this pod "
            "loads, unloads and binds nothing and is never ready"
        )
        self.check()
        while not self.stopped(self.every):
            self.check()
        self.say("stopping; nothing to undo (pre-stage mode changes only its drop)")
        return 0

"""``nvidia-driver``: the GPU operator's driver-container contract on a modstage host.

The operator runs ``nvidia-driver init`` in its driver pod (and ``reload_nvidia_peermem``,
``probe_nvidia_peermem`` in its peermem sidecar); ``nvidia-driver prestage`` is a precompiled
pool's pre-stage DaemonSet (:mod:`stager.prestage`). Here ``init`` never loads or unloads
a module:

* the loaded driver (``/sys/module/nvidia/version``) is this image's version: finish as
  NVIDIA's container does (driver root at ``/run/nvidia/driver``, the state file with
  ``DRIVER_CONFIG_DIGEST``, readiness) and sleep; SIGTERM leaves the modules loaded;
* otherwise: refuse at once if the image carries no modules for the running kernel; stage
  the modules, firmware, ``/drivers/*.conf`` parameters and the digest under
  ``/run/nvidia/modstage/incoming`` (the pod's only host mount); wait for the host's
  verdict in ``/run/nvidia/modstage/status``. The host reboots the node to load it; the
  next pod finds it loaded. A rejection or a failed load is printed and exits 1.

An image may carry modules for several kernels (``/opt/modstage/modules/<release>/``). While
the pod sleeps, and while it waits for its own bundle's reboot, it reads the host's
announcement (``status/_host.json``) every ``MODSTAGE_NEXT_KERNEL_EVERY`` seconds: when the
next boot runs another kernel (a kernel update was installed) and the host has no ``nvidia``
generation for it, the pod stages the image's modules for that kernel, once; the host
judges them against that kernel's own files and holds the reboot until it has
(:mod:`service.rebooting.gate`). A kernel the image does not carry, and a refusal, are said in the
pod's log. ``init`` also stages, once, for each other kernel
the host announces as installed that the image carries (:mod:`stager.other_kernels`).

Settings come from the image's environment (see :class:`Settings`). Standard library only.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, TextIO

from stager.other_kernels import stage_installed
from stager.schema.atomic import write_atomic
from stager.schema.failures import StagerError
from stager.schema.statusfile import StatusFile
from stager.wait import EXIT_ACTIVE, Awaited, wait_for

if TYPE_CHECKING:
    from stager.prestage import Prestage

EXIT_FAILED = 1


@dataclass(frozen=True)
class Settings:
    """What the image and the operator tell ``nvidia-driver``, paths under ``root``."""

    version: str
    kernel: str
    modules: tuple[str, ...]
    module_dir: Path
    firmware_dir: Path | None
    params_dir: Path
    modstage_dir: Path
    run_dir: Path
    sys_dir: Path
    digest: str | None = None
    host_wait: float = 900.0
    modules_root: Path | None = None  # per-kernel module directories (None: only module_dir)
    next_kernel_every: float = 60.0  # seconds between reads of the host's announcement

    @classmethod
    def from_environ(cls, env: Mapping[str, str], root: Path = Path("/")) -> Settings:
        """Read ``DRIVER_VERSION`` (required), ``KERNEL_VERSION``, ``DRIVER_CONFIG_DIGEST``
        and the ``MODSTAGE_*`` settings; raise :class:`StagerError` naming what is missing."""
        version = env.get("DRIVER_VERSION", "")
        if not version:
            raise StagerError("DRIVER_VERSION: not set (the image must name its driver version)")
        kernel = env.get("KERNEL_VERSION") or os.uname().release
        fw = env.get("MODSTAGE_FIRMWARE_DIR", "/opt/modstage/firmware")
        return cls(
            version=version,
            kernel=kernel,
            modules=tuple(env.get("MODSTAGE_MODULES", "nvidia nvidia-modeset nvidia-uvm").split()),
            module_dir=_at(root, env.get("MODSTAGE_MODULE_DIR", f"/opt/modstage/modules/{kernel}")),
            firmware_dir=_at(root, fw) if fw else None,
            params_dir=_at(root, env.get("MODSTAGE_PARAMS_DIR", "/drivers")),
            modstage_dir=_at(root, env.get("MODSTAGE_DIR", "/run/nvidia/modstage")),
            run_dir=_at(root, env.get("RUN_DIR", "/run/nvidia")),
            sys_dir=_at(root, "/sys"),
            digest=env.get("DRIVER_CONFIG_DIGEST") or None,
            host_wait=float(env.get("MODSTAGE_HOST_WAIT", "900")),
            modules_root=_at(root, env.get("MODSTAGE_MODULES_ROOT", "/opt/modstage/modules")),
            next_kernel_every=float(env.get("MODSTAGE_NEXT_KERNEL_EVERY", "60")),
        )

    def modules_for(self, release: str) -> Path | None:
        """The image's module directory for kernel ``release``, when it carries every
        module of the bundle for it (None: it does not)."""
        if release == self.kernel:
            directory = self.module_dir
        elif self.modules_root is not None:
            directory = self.modules_root / release
        else:
            return None
        return directory if all((directory / f"{m}.ko").is_file() for m in self.modules) else None

    def carried(self) -> list[str]:
        """The kernel releases the image carries the bundle's modules for."""
        found = {self.kernel} if self.modules_for(self.kernel) else set()
        if self.modules_root is not None and self.modules_root.is_dir():
            found |= {d.name for d in self.modules_root.iterdir() if self.modules_for(d.name)}
        return sorted(found)

    @property
    def host_file(self) -> Path:
        """The host's announcement of its kernels (``service.publish.announce``)."""
        return self.modstage_dir / "status" / "_host.json"

    @property
    def ready_file(self) -> Path:
        """The operator's readiness file (its startup probe writes it too)."""
        return self.run_dir / "validations/.driver-ctr-ready"

    @property
    def state_file(self) -> Path:
        """The file k8s-driver-manager compares with DRIVER_CONFIG_DIGEST."""
        return self.run_dir / "nvidia-driver.state"

    @property
    def driver_root(self) -> Path:
        """Where the other operands find the driver's root file system."""
        return self.run_dir / "driver"


def _at(root: Path, absolute: str) -> Path:
    return root / absolute.lstrip("/")


def loaded_version(sys_dir: Path, module: str = "nvidia") -> str | None:
    """The version of the loaded ``module`` ('' if it has none), None if it is not loaded."""
    base = sys_dir / "module" / module
    if not (base / "refcnt").exists() and not (base / "initstate").exists():
        return None
    try:
        return (base / "version").read_text().strip()
    except OSError:
        return ""


@dataclass
class Driver:
    """One ``nvidia-driver`` run; side effects are injectable for tests."""

    settings: Settings
    out: TextIO
    running_kernel: str = ""
    mount: Callable[[Sequence[str]], int] = lambda argv: subprocess.call(list(argv))
    sleep: Callable[[float], None] = time.sleep
    wait_interval: float = 2.0
    # the next kernels this pod staged for (drop name) or said it cannot: once each
    next_staged: dict[str, str] = field(default_factory=dict)
    next_said: set[str] = field(default_factory=set)

    def say(self, message: str) -> None:
        """One line of progress for ``kubectl logs``."""
        print(f"nvidia-driver: {message}", file=self.out, flush=True)

    def init(self, forever: Callable[[], None] | None = None) -> int:
        """The operator's ``init``: finish if our version is loaded, else stage and wait."""
        s = self.settings
        s.ready_file.unlink(missing_ok=True)
        loaded = loaded_version(s.sys_dir)
        running = self.running_kernel or os.uname().release
        if loaded == s.version:
            self.finish()
            stage_installed(self, running)
            (forever or self.sleep_until_term)()
            return 0
        if s.kernel != running:
            carried = ", ".join(s.carried()) or "none"
            raise StagerError(
                f"this image's modules are built for kernel {s.kernel} (it carries: "
                f"{carried}), the node runs {running}: use an image that carries {running}"
            )
        if s.modules_for(running) is None:
            carried = ", ".join(s.carried()) or "none"
            raise StagerError(
                f"this image carries no modules for kernel {running} (it carries: "
                f"{carried}): use an image that carries {running}"
            )
        shown = "no nvidia driver" if loaded is None else f"nvidia {loaded or '(no version)'}"
        stage_installed(self, running)  # first: the running kernel's drop keeps the pending slot
        self.say(f"{shown} loaded; staging nvidia {s.version} for the host to load at boot")
        code = self.stage_and_wait()
        if code != EXIT_ACTIVE:
            return code
        now = loaded_version(s.sys_dir)
        if now != s.version:
            raise StagerError(
                f"the host reports nvidia {s.version} active but the kernel has "
                f"{now or 'no nvidia module'} loaded (unloaded since? a reboot loads it again)"
            )
        self.finish()
        (forever or self.sleep_until_term)()
        return 0

    def stage_for(self, kernel: str, module_dir: Path) -> Path:
        """Stage the bundle for ``kernel`` from ``module_dir``; the drop."""
        from stager.drop import ModuleSpec, stage

        s = self.settings
        if s.firmware_dir is not None and not s.firmware_dir.is_dir():
            raise StagerError(
                f"{s.firmware_dir}: firmware directory does not exist "
                "(set MODSTAGE_FIRMWARE_DIR= to stage no firmware)"
            )
        return stage(
            s.modstage_dir / "incoming",
            bundle="nvidia",
            version=s.version,
            kernel=kernel,
            modules=[ModuleSpec(module_dir / f"{name}.ko") for name in s.modules],
            params_dir=s.params_dir if s.params_dir.is_dir() else None,
            firmware_dirs=(s.firmware_dir,) if s.firmware_dir else (),
            config_digest=s.digest,
        )

    def stage_and_wait(self) -> int:
        """Stage the bundle into the host's pod directory and wait for its verdict, staging
        for the next boot's kernel meanwhile when the host announces one."""
        from stager.schema.manifest import Manifest

        s = self.settings
        self._wait_for_host(s.modstage_dir / "incoming")
        drop = self.stage_for(s.kernel, s.module_dir)
        generation = Manifest.read(drop).digest
        self.say(f"staged {drop.name} (generation {generation[:12]}); waiting for the host")
        status = s.modstage_dir / "status" / "nvidia.json"
        return wait_for(
            lambda: StatusFile.read(status),
            Awaited.from_drop(drop, generation),
            self.say,
            interval=self.wait_interval,
            sleep=self._sleep_looking_ahead(),
        )

    def _sleep_looking_ahead(self) -> Callable[[float], None]:
        """:attr:`sleep` that also looks for the next kernel (:meth:`look_ahead`) each time
        ``next_kernel_every`` seconds were slept, as :meth:`sleep_until_term` does: a pod
        waiting for its own reboot stages for a kernel update installed meanwhile."""
        slept = 0.0

        def sleep(seconds: float) -> None:
            nonlocal slept
            self.sleep(seconds)
            slept += seconds
            if slept >= self.settings.next_kernel_every:
                slept = 0.0
                self.look_ahead()

        return sleep

    def _wait_for_host(self, incoming: Path) -> None:
        """The host's daemon creates the directory at start (``/run`` is empty after boot)."""
        waited = 0.0
        while not incoming.is_dir():
            if waited >= self.settings.host_wait:
                raise StagerError(
                    f"{incoming}: does not exist after {waited:g} s; is modstage serve running "
                    "on the host with this directory in incoming_dirs?"
                )
            if waited == 0:
                self.say(f"waiting for the host's modstage to create {incoming}")
            self.sleep(1.0)
            waited += 1.0

    def finish(self) -> None:
        """Driver root for the other operands, state file, readiness: as NVIDIA's does."""
        s = self.settings
        root = s.driver_root
        root.mkdir(parents=True, exist_ok=True)
        if not os.path.ismount(root) and self.mount(["mount", "--rbind", "/", str(root)]) != 0:
            raise StagerError(f"{root}: cannot bind the driver root there")
        if s.digest is not None:
            write_atomic(s.state_file, s.digest.encode())
        s.ready_file.parent.mkdir(parents=True, exist_ok=True)
        write_atomic(s.ready_file, b"")
        self.say(f"nvidia {s.version} is loaded (by the host); driver root at {root}; ready")

    def next_kernel(self) -> str | None:
        """Stage for the kernel the next boot runs when the host announces one it has no
        ``nvidia`` generation of this image's version for, no drop for it waiting to be
        judged (cover ``waiting``), and this image carries it (once per kernel); say once
        when the image does not carry it, and when the host refused what was staged. The
        drop staged, if any."""
        s = self.settings
        try:
            doc = json.loads(s.host_file.read_bytes())
            release = doc.get("next_kernel")
            running = doc.get("running_kernel")
            entry = (doc.get("bundles") or {}).get("nvidia", {})
            cover, version = entry.get("next"), entry.get("next_version")
        except (OSError, ValueError, AttributeError):
            return None  # an older host, or none yet: nothing announced
        # ready with another version: an older build carried for that kernel would load;
        # waiting: a drop for it (a restarted pod's predecessor's) is not judged yet
        current = cover == "ready" and version in (None, s.version)
        if not isinstance(release, str) or release == running or current or cover == "waiting":
            return None
        if release in self.next_staged:
            self._refused(release)
            return None
        module_dir = s.modules_for(release)
        if module_dir is None:
            if release not in self.next_said:
                self.next_said.add(release)
                self.say(
                    f"the next boot runs kernel {release}, which this image carries no modules "
                    f"for (it carries: {', '.join(s.carried()) or 'none'}): the host holds "
                    "that reboot for a while; stage an image that carries it"
                )
            return None
        drop = self.stage_for(release, module_dir)
        self.next_staged[release] = drop.name
        self.say(
            f"the next boot runs kernel {release}: staged {drop.name} for it (the host "
            "judges it against that kernel's files before the reboot)"
        )
        return drop.name

    def _refused(self, release: str) -> None:
        """Say the host's refusal of the drop staged for ``release``, once."""
        drop = self.next_staged[release]
        if f"refused:{release}" in self.next_said:
            return
        doc = StatusFile.read(self.settings.modstage_dir / "status" / "nvidia.json")
        reason = (doc.rejected or {}).get(drop) if doc is not None else None
        if reason is not None:
            self.next_said.add(f"refused:{release}")
            self.say(f"the host refused {drop} for kernel {release}: {reason}")

    def look_ahead(self) -> None:
        """:meth:`next_kernel`, a failure said in the pod's log (the next look tries again)."""
        try:
            self.next_kernel()
        except (OSError, StagerError) as exc:
            self.say(f"staging for the next kernel failed: {exc}")

    def sleep_until_term(self) -> None:
        """Sleep until SIGTERM or SIGINT, staging for the next boot's kernel when the host
        announces one (:meth:`next_kernel`); the modules stay loaded (only a reboot changes
        them)."""
        signals = {signal.SIGTERM, signal.SIGINT}
        signal.pthread_sigmask(signal.SIG_BLOCK, signals)
        while signal.sigtimedwait(signals, self.settings.next_kernel_every) is None:
            self.look_ahead()
        self.say("stopping; the nvidia modules stay loaded (the host changes them at boot)")
        self.mount(["umount", "--lazy", str(self.settings.driver_root)])

    def probe_peermem(self) -> int:
        """``probe_nvidia_peermem``: 0 if nvidia-peermem is loaded, 1 (saying why) if not."""
        if loaded_version(self.settings.sys_dir, "nvidia_peermem") is not None:
            return 0
        self.say(
            "nvidia-peermem is not loaded: add it to the bundle (MODSTAGE_MODULES) so the "
            "host loads it at boot; this host never loads modules from a container"
        )
        return EXIT_FAILED

    def reload_peermem(self, forever: Callable[[], None] | None = None) -> int:
        """``reload_nvidia_peermem``: nothing to load here; report, then keep the sidecar up."""
        code = self.probe_peermem()
        if code == 0:
            self.say("nvidia-peermem is loaded by the host from the bundle")
            (forever or self.sleep_until_term)()
        return code


def prestage(
    env: Mapping[str, str],
    out: TextIO,
    root: Path = Path("/"),
    stopped: Callable[[float], bool] | None = None,
) -> Prestage:
    """``nvidia-driver prestage`` (:mod:`stager.prestage`): this image's settings narrowed to
    its own kernel (the one ``DRIVER_CONFIG_DIGEST`` is for), a driver that mounts nothing."""
    from stager.prestage import Prestage, mounts_nothing, require, stop_signals

    require(env)
    s = replace(Settings.from_environ(env, root), modules_root=None)
    driver = Driver(s, out, mount=mounts_nothing)
    what = f"nvidia {s.version} for kernel {s.kernel}"
    return Prestage(
        driver.next_kernel, driver.say, what, s.next_kernel_every, stopped or stop_signals()
    )


VERBS = ("init", "reload_nvidia_peermem", "probe_nvidia_peermem", "prestage")


def main(argv: Sequence[str] | None = None, out: TextIO | None = None) -> int:
    """``nvidia-driver VERB``; errors are one line on stderr and exit 1."""
    args = list(sys.argv[1:] if argv is None else argv)
    out = out if out is not None else sys.stdout
    if len(args) != 1 or args[0] not in VERBS:
        print(f"usage: nvidia-driver {{{'|'.join(VERBS)}}}", file=sys.stderr)
        return 2
    try:
        if args[0] == "prestage":  # a precompiled pool's next kernel (stager/prestage.py)
            return prestage(os.environ, out).run()
        driver = Driver(Settings.from_environ(os.environ), out)
        if args[0] == "init":
            return driver.init()
        if args[0] == "reload_nvidia_peermem":
            return driver.reload_peermem()
        return driver.probe_peermem()
    except StagerError as exc:
        print(f"nvidia-driver {args[0]}: error: {exc}", file=sys.stderr, flush=True)
        return EXIT_FAILED


if __name__ == "__main__":
    sys.exit(main())

"""One host, built the same way by every entry point: :class:`Host`.

A :class:`Host` holds what the commands build from a layout: the config, the trusted
certificates, the kernel, the kernel's keyrings, the reboot backend and intake. Each
part is built (and its module imported) the first time it is asked for, so a command
pays only for what it uses: ``modstage boot`` never imports the reboot backends nor
intake, ``modstage verify`` never reads ``config.toml``. The crash-test runner builds
its host here too, with a fake kernel.
"""

from __future__ import annotations

from functools import cached_property
from pathlib import Path
from typing import TYPE_CHECKING

from service.config import Config
from service.host.running import RunningHost
from service.layout import Layout, modules_dir

if TYPE_CHECKING:  # imported when first used: the daemon never loads the verify stack
    from collections.abc import Callable

    from service.host.modules import Kernel
    from service.intake.scan import Intake
    from service.rebooting.request import Rebooter
    from service.verify.modfile.modinfo import ModInfo
    from service.verify.signature.keyring import Keyring
    from service.verify.signature.trust import TrustStore


def kernel_for(layout: Layout, running: RunningHost | None = None) -> Kernel:
    """The real kernel on ``/``, a recording one under any other root (a sandbox);
    ``running``: the host's facts as the command read them (None: read here)."""
    running = running if running is not None else RunningHost.read(layout)
    if running.sandboxed:
        from service.host.recording import RecordingKernel

        # modprobe resolves through the target's module tree, as on a real node
        release = running.release
        modules = modules_dir(layout, release) if release is not None else None
        return RecordingKernel(layout.sys, identify=identify, modules=modules, shows=True)
    from service.host.modules import LinuxKernel

    return LinuxKernel(layout.sys)


def identify(read_at: Callable[[int, int], bytes], size: int) -> ModInfo:
    """``ModInfo.from_elf``, imported when the sandbox's kernel records its first load."""
    from service.verify.modfile.modinfo import ModInfo

    return ModInfo.from_elf(read_at, size)


class Host:
    """The parts of the host at ``layout``, each built once, when first used.

    ``kernel``: replaces the one :func:`kernel_for` picks (the crash tests' fake).
    ``salvage``: read ``config.toml`` as the boot does (a problem falls back to the
    default for what cannot be read; :attr:`config_problems` names each) instead of
    refusing it. ``trusted``: another certificate directory than the layout's.
    ``strict_trust``: an unusable certificate file is an error, not skipped.
    (A plain class, not a dataclass: it is a service object, not a value, and building
    a dataclass costs every ``modstage boot`` about 0.4 ms.)
    """

    def __init__(
        self,
        layout: Layout,
        kernel: Kernel | None = None,
        *,
        trusted: Path | None = None,
        salvage: bool = False,
        strict_trust: bool = False,
        running: RunningHost | None = None,
    ) -> None:
        self.layout, self.given_kernel, self.trusted = layout, kernel, trusted
        self.salvage, self.strict_trust = salvage, strict_trust
        self.given_running = running

    @cached_property
    def _config(self) -> tuple[Config, tuple[str, ...]]:
        if self.salvage:
            config, problems = Config.salvage(self.layout.config)
            return config, tuple(problems)
        return Config.load(self.layout.config), ()

    @property
    def config(self) -> Config:
        """The host policy; raises :class:`~service.errors.ConfigError` unless salvaging."""
        return self._config[0]

    @property
    def config_problems(self) -> tuple[str, ...]:
        """What salvaging the config passed over (always empty without ``salvage``)."""
        return self._config[1]

    @cached_property
    def trust(self) -> TrustStore:
        """The trusted certificates (``trusted`` or the layout's ``trusted.d``)."""
        from service.verify.signature.trust import TrustStore

        where = self.trusted or self.layout.trusted
        return TrustStore.from_directory(where, strict=self.strict_trust)

    @cached_property
    def kernel(self) -> Kernel:
        """The kernel given, else :func:`kernel_for` the layout."""
        given = self.given_kernel
        return given if given is not None else kernel_for(self.layout, self.running)

    @cached_property
    def running(self) -> RunningHost:
        """The running host's facts as the command read them, else read here, once
        (:class:`~service.host.running.RunningHost`)."""
        given = self.given_running
        return given if given is not None else RunningHost.read(self.layout)

    @cached_property
    def keyring(self) -> Keyring:
        """The running kernel's keyrings (intake's pre-flight asks them)."""
        from service.verify.signature.keyring import KernelKeyring

        return KernelKeyring(self.layout.proc)

    @cached_property
    def rebooter(self) -> Rebooter:
        """The reboot backend the config names (only recording under a sandbox root)."""
        from service.rebooting.request import rebooter

        return rebooter(self.config.reboot, self.layout, self.config.kernel.next)

    @cached_property
    def intake(self) -> Intake:
        """Intake for this host (``modstage intake`` and the daemon build the same)."""
        from service.intake.scan import Intake

        return Intake(
            layout=self.layout, config=self.config, trust=self.trust, keyring=self.keyring
        )

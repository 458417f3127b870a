"""A kernel that loads nothing: what ``--root`` other than ``/`` uses instead of the real one.

Under a sandbox root modstage must not change the machine it runs on. This
:class:`~service.kernel.modules.Kernel` records every ``finit_module``,
``delete_module`` and ``modprobe`` it stands in for, reads the live modules from
the sandbox's own ``sys/module`` tree, and keeps its own view of what it
"loaded", so the loader's decisions (already loaded, another version, undo on
failure) run exactly as on a host.
"""

from __future__ import annotations

import errno
import os
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

from service.errors import LoadError, ServiceError
from service.kernel.modules import live_modules, own_fd
from service.kernel.sysfs import Sysfs
from stager.paths import normalize_module_name


class Identity(Protocol):
    """What a module's ELF says about it (:class:`~service.verify.modinfo.ModInfo` is one)."""

    @property
    def module_name(self) -> str | None:
        """The name the kernel registers (``struct module``'s)."""

    @property
    def name(self) -> str | None:
        """``.modinfo``'s ``name=``."""

    @property
    def srcversion(self) -> str | None:
        """``.modinfo``'s ``srcversion=``."""


Identify = Callable[[Callable[[int, int], bytes], int], Identity]


@dataclass
class RecordingKernel:
    """Records kernel calls; ``sys`` is the sandbox's sysfs root.

    ``identify`` reads a module's ELF (``ModInfo.from_elf``, passed in by the command: the
    kernel layer does not import verification) so a load is recorded under the module's
    own name, as the kernel names it; without it, the file's name stands in.
    """

    sys: Path
    calls: list[tuple[str, ...]] = field(default_factory=list)
    _live: dict[str, str | None] | None = None
    identify: Identify | None = None

    def _view(self) -> dict[str, str | None]:
        if self._live is None:
            self._live = live_modules(Sysfs(self.sys))
        return self._live

    def load(self, fd: int, params: str) -> None:
        """Record the module file (by this process's own descriptor) and its parameters."""
        path = os.readlink(own_fd(fd))  # names the store file the loader opened
        self.calls.append(("finit_module", path, params))
        self._record(Path(path).name, lambda at, n: os.pread(fd, n, at), os.fstat(fd).st_size)

    def load_image(self, image: bytes, name: str, params: str) -> None:
        """Record a decompressed image's load (from a memfd named ``name``, flags 0)."""
        self.calls.append(("finit_module", f"memfd:{name}", params))
        self._record(name, lambda at, n: image[at : at + n], len(image))

    def _record(self, file: str, read_at: Callable[[int, int], bytes], size: int) -> None:
        """The module is live under its ELF name (the file's name without ``identify``)."""
        name, srcversion = file.split(".", 1)[0], None
        if self.identify is not None:
            try:
                info = self.identify(read_at, size)
            except ServiceError as exc:  # the kernel refuses an ELF it cannot read
                raise LoadError(errno.ENOEXEC, f"{file}: {exc}") from exc
            name, srcversion = info.module_name or info.name or name, info.srcversion
        self._view()[normalize_module_name(name)] = srcversion

    def unload(self, name: str) -> None:
        """Record the unload; a module this kernel never saw is ENOENT, as on a host."""
        self.calls.append(("delete_module", name))
        if self._view().pop(name, "absent") == "absent":
            raise LoadError(errno.ENOENT, f"cannot unload {name}: not loaded")

    def loaded(self) -> dict[str, str | None]:
        """The sandbox's live modules plus what this kernel recorded as loaded."""
        return dict(self._view())

    def modprobe(self, names: list[str]) -> None:
        """Record the in-tree modules ``modprobe`` would load."""
        if names:
            self.calls.append(("modprobe", *names))
            self._view().update(dict.fromkeys(names))

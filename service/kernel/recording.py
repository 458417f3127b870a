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
from dataclasses import dataclass, field
from pathlib import Path

from service.errors import LoadError
from service.kernel.modules import live_modules, own_fd
from service.kernel.sysfs import Sysfs


@dataclass
class RecordingKernel:
    """Records kernel calls; ``sys`` is the sandbox's sysfs root."""

    sys: Path
    calls: list[tuple[str, ...]] = field(default_factory=list)
    _live: dict[str, str | None] | None = None

    def _view(self) -> dict[str, str | None]:
        if self._live is None:
            self._live = live_modules(Sysfs(self.sys))
        return self._live

    def load(self, fd: int, params: str, *, compressed: bool = False) -> None:
        """Record the module file (by this process's own descriptor) and its parameters."""
        path = os.readlink(own_fd(fd))  # names the store file the loader opened
        self.calls.append(("finit_module", path, params))
        name = Path(path).name.split(".", 1)[0].replace("-", "_")
        self._view()[name] = None

    def load_image(self, image: bytes, name: str, params: str) -> None:
        """Record a decompressed image's load (from a memfd named ``name``, flags 0)."""
        self.calls.append(("finit_module", f"memfd:{name}", params))
        self._view()[name.split(".", 1)[0].replace("-", "_")] = None

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

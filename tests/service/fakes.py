"""Recording fakes for the host's side effects, and a temporary host tree."""

from __future__ import annotations

import errno
import os
import shutil
from pathlib import Path

from service.errors import LoadError
from service.kernel.modules import describe
from service.layout import Layout
from tests.kmod.target import install_target


class FakeKernel:
    """A kernel that records loads; ``fail`` maps a module name to the errno it returns."""

    def __init__(
        self, fail: dict[str, int] | None = None, live: dict[str, str | None] | None = None
    ) -> None:
        self.fail = fail or {}
        self.live: dict[str, str | None] = dict(live or {})
        self.calls: list[tuple[str, ...]] = []

    def load(self, fd: int, params: str, *, compressed: bool = False) -> None:
        name = Path(os.readlink(f"/proc/self/fd/{fd}")).name.split(".")[0].replace("-", "_")
        self.calls.append(("load", name, params))
        if name in self.fail:
            raise LoadError(self.fail[name], describe(self.fail[name]))
        self.live[name] = None

    def load_image(self, image: bytes, name: str, params: str) -> None:
        name = name.split(".")[0].replace("-", "_")
        self.calls.append(("load", name, params))
        if name in self.fail:
            raise LoadError(self.fail[name], describe(self.fail[name]))
        self.live[name] = None

    def unload(self, name: str) -> None:
        self.calls.append(("unload", name))
        if self.live.pop(name, "absent") == "absent":
            raise LoadError(errno.ENOENT, f"cannot unload {name}")

    def loaded(self) -> dict[str, str | None]:
        return dict(self.live)

    def modprobe(self, names: list[str]) -> None:
        if names:
            self.calls.append(("modprobe", *names))
            self.live.update(dict.fromkeys(names))


def make_host(root: Path, kernel: str, cert: Path, blocks: dict[int, str] | None = None) -> Layout:
    """A host tree: trusted cert, procfs facts, and a sysfs with memory and firmware_class."""
    layout = Layout(root)
    layout.trusted.mkdir(parents=True)
    shutil.copy(cert, layout.trusted / cert.name)
    (layout.proc / "sys/kernel/random").mkdir(parents=True)
    layout.os_release.write_text(kernel + "\n")
    layout.boot_id.write_text("11111111-2222-3333-4444-555555555555\n")
    install_target(root, kernel)  # the target's vermagic and config, read by verification
    layout.incoming.mkdir(parents=True)
    memory = layout.sys / "devices/system/memory"
    memory.mkdir(parents=True)
    (memory / "auto_online_blocks").write_text("offline\n")
    for n, state in (blocks or {}).items():
        (memory / f"memory{n}").mkdir()
        (memory / f"memory{n}" / "state").write_text(state + "\n")
    fw = layout.sys / "module/firmware_class/parameters"
    fw.mkdir(parents=True)
    (fw / "path").write_text("\n")
    return layout

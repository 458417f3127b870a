"""The firmware view: one directory of links into the generations being loaded.

``firmware_class.path`` holds a single directory, so modstage points it at
``/run/modstage/firmware`` and fills that with symlinks into each loaded
generation's ``firmware/`` tree (the kernel's loader follows them). A foreign,
non-empty value is not replaced unless the host allows it; when no loaded
generation carries firmware, modstage clears a value it set itself.
"""

from __future__ import annotations

import os
from pathlib import Path

from service.errors import BootError
from service.host.sysfs import Sysfs

PATH_PARAM = "module/firmware_class/parameters/path"
PATH_MAX_BYTES = 255  # fw_path_para[256], set by param_set_copystring (longer: ENOSPC)
# param_attr_store hands the written bytes to param_set_copystring verbatim: "\n" would be
# kept as the path. A lone NUL is copied as the empty string, which clears it.
CLEAR = "\0"


class FirmwareView:
    """The view directory and the kernel parameter that points at it."""

    def __init__(self, view: Path, sysfs: Sysfs, *, allow_foreign: bool) -> None:
        self.view = view
        self.sysfs = sysfs
        self.allow_foreign = allow_foreign

    def link(self, generation: Path) -> int:
        """Link every file under ``generation/firmware`` into the view; return how many."""
        source = generation / "firmware"
        count = 0
        for directory, _dirs, files in os.walk(source):
            for name in files:
                target = Path(directory) / name
                link = self.view / target.relative_to(source)
                link.parent.mkdir(parents=True, exist_ok=True)
                if link.is_symlink() and not Path(os.readlink(link)).is_relative_to(generation):
                    raise BootError(
                        f"firmware {link.relative_to(self.view)} is already provided by "
                        f"{Path(os.readlink(link)).parent}; two bundles ship the same file"
                    )
                link.unlink(missing_ok=True)
                link.symlink_to(target)
                count += 1
        return count

    def unlink(self, generation: Path) -> None:
        """Remove the view's links into ``generation``."""
        if not self.view.is_dir():
            return
        for directory, _dirs, files in os.walk(self.view):
            for name in files:
                link = Path(directory) / name
                if link.is_symlink() and Path(os.readlink(link)).is_relative_to(generation):
                    link.unlink()

    def has_links(self) -> bool:
        """Whether the view links any firmware."""
        return self.view.is_dir() and any(p.is_symlink() for p in self.view.rglob("*"))

    def point(self, wanted: bool) -> None:
        """Point ``firmware_class.path`` at the view if ``wanted``, else clear our value."""
        try:
            current = self.sysfs.read(PATH_PARAM).strip().strip("\0")
        except FileNotFoundError:
            if wanted:
                raise BootError("the kernel has no firmware_class.path parameter") from None
            return
        mine = str(self.view)
        if not wanted:
            if current == mine:
                self.sysfs.write(PATH_PARAM, CLEAR)
            return
        if len(mine.encode()) > PATH_MAX_BYTES:
            raise BootError(
                f"firmware view {mine!r} is longer than firmware_class.path's "
                f"{PATH_MAX_BYTES} bytes"
            )
        if current and current != mine and not self.allow_foreign:
            raise BootError(
                f"firmware_class.path is already set to {current!r} by someone else; "
                "set allow_foreign_firmware_path = true to let modstage replace it"
            )
        self._make_view()
        self.sysfs.write(PATH_PARAM, mine)

    def _make_view(self) -> None:
        self.view.mkdir(parents=True, exist_ok=True)


class RecordingFirmwareView(FirmwareView):
    """The view as it is, its changes recorded in ``events`` instead of made (a dry run)."""

    def __init__(
        self, view: Path, sysfs: Sysfs, events: list[tuple[str, ...]], *, allow_foreign: bool
    ) -> None:
        super().__init__(view, sysfs, allow_foreign=allow_foreign)
        self.events = events
        self.linked: dict[Path, int] = {}  # generation -> files it would have linked

    def link(self, generation: Path) -> int:
        """Record the files :meth:`FirmwareView.link` would link; return how many."""
        source = generation / "firmware"
        files = sorted(p for p in source.rglob("*") if p.is_file() or p.is_symlink())
        for target in files:
            link = self.view / target.relative_to(source)
            if link.is_symlink() and not Path(os.readlink(link)).is_relative_to(generation):
                raise BootError(
                    f"firmware {link.relative_to(self.view)} is already provided by "
                    f"{Path(os.readlink(link)).parent}; two bundles ship the same file"
                )
            self.events.append(("link", str(target.relative_to(generation))))
        self.linked[generation] = len(files)
        return len(files)

    def unlink(self, generation: Path) -> None:
        """Record that the view's links into ``generation`` would be removed."""
        self.linked.pop(generation, None)
        self.events.append(("unlink", str(generation)))

    def has_links(self) -> bool:
        """Whether the view would link any firmware (recorded links, or the view's own)."""
        return any(self.linked.values()) or super().has_links()

    def _make_view(self) -> None:
        pass  # recorded with the parameter's write

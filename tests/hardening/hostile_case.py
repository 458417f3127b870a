"""The hostile-drop catalogue's frame (tests/hardening/test_hostile_drops.py): a freshly
staged good drop (:class:`Ctx`), how a case plants its harm in it (:data:`Plant`: the reasons
the intake must give) and the host policy it meets (:class:`Case`)."""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import tomllib
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import tomli_w

from service.config import Config
from service.layout import Layout
from stager.schema.paths import MANIFEST_NAME

M = "modules/ms_exporter.ko"


F = "firmware/fw/blob.bin"


SHADOW = Path("/etc/shadow")


NOTDIR = "a directory on its path is not a directory (or is a symbolic link)"


@dataclass
class Ctx:
    """A freshly staged good drop (``M`` and ``F``) and a directory outside it."""

    drop: Path
    outside: Path
    layout: Layout
    signed: dict[str, Path]
    kernel: str
    untrusted: Path  # ms_exporter signed by a key nobody trusts
    unsigned: Path

    @property
    def d(self) -> str:
        return str(self.drop)

    @property
    def m(self) -> str:
        return f"{self.drop}/manifest.toml"

    def manifest(self) -> dict[str, object]:
        return tomllib.loads((self.drop / MANIFEST_NAME).read_text())

    def rewrite(self, data: dict[str, object] | bytes) -> None:
        raw = data if isinstance(data, bytes) else tomli_w.dumps(data).encode()
        (self.drop / MANIFEST_NAME).unlink()
        (self.drop / MANIFEST_NAME).write_bytes(raw)

    def set_file(self, key: str, path: str) -> None:
        data = self.manifest()
        data[key][0]["file"] = path  # type: ignore[index]
        self.rewrite(data)

    def replace_with(self, rel: str, make: Callable[[Path], object]) -> None:
        target = self.drop / rel
        if target.is_dir() and not target.is_symlink():
            shutil.rmtree(target)
        else:
            target.unlink()
        make(target)


Plant = Callable[[Ctx], list[str | re.Pattern[str]]]


@dataclass(frozen=True)
class Case:
    """One hostile drop: how to plant it, and the host policy it meets."""

    id: str
    plant: Plant
    config: Config = field(default_factory=Config)


def sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def mknod(kind: int, major: int, minor: int) -> Callable[[Path], None]:
    return lambda p: os.mknod(p, kind | 0o600, os.makedev(major, minor))


def moved_out(ctx: Ctx, rel: str) -> Path:
    out = ctx.outside / f"moved-{rel.replace('/', '_')}"
    shutil.move(ctx.drop / rel, out)
    return out

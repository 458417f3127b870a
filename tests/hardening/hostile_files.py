"""Hostile drops whose files are not what the manifest says: symbolic and hard links,
FIFOs, sockets, device nodes, directories, missing files, and sizes and counts over the
limits (:data:`FILE_CASES`)."""

from __future__ import annotations

import os
import re
import shutil
import stat
from collections.abc import Callable
from pathlib import Path

from service.config import Config, Limits
from stager.schema.paths import MANIFEST_NAME
from tests.hardening.hostile_case import (
    NOTDIR,
    SHADOW,
    Case,
    Ctx,
    F,
    M,
    Plant,
    mknod,
    moved_out,
)


def _drop_is_symlink(ctx: Ctx) -> list[str | re.Pattern[str]]:
    real = ctx.outside / "real-drop"
    shutil.move(ctx.drop, real)
    ctx.drop.symlink_to(real)
    return [f"{ctx.d}: is a symbolic link"]


def _sym(rel: str, target: Callable[[Ctx], str | Path]) -> Case:
    def plant(ctx: Ctx) -> list[str | re.Pattern[str]]:
        ctx.replace_with(rel, lambda p: p.symlink_to(target(ctx)))
        return [f"{ctx.d}/{rel}: is a symbolic link"]

    return Case(
        f"symlink-{rel.split('/')[0]}-{target.__name__ if hasattr(target, '__name__') else ''}",
        plant,
    )


def _kind(case_id: str, rel: str, make: Callable[[Path], object], why: str) -> Case:
    def plant(ctx: Ctx) -> list[str | re.Pattern[str]]:
        ctx.replace_with(rel, make)
        return [f"{ctx.d}/{rel}: {why}"]

    return Case(case_id, plant)


def _hardlink(case_id: str, rel: str) -> Case:
    def plant(ctx: Ctx) -> list[str | re.Pattern[str]]:
        out = moved_out(ctx, rel)
        os.link(out, ctx.drop / rel)
        return [f"{ctx.d}/{rel}: has 2 hard links (a drop file must have one)"]

    return Case(case_id, plant)


def _dir_symlink(case_id: str, rel_dir: str, file: str) -> Case:
    def plant(ctx: Ctx) -> list[str | re.Pattern[str]]:
        out = moved_out(ctx, rel_dir)
        ctx.drop.joinpath(rel_dir).symlink_to(out)
        return [f"{ctx.d}/{file}: {NOTDIR}"]

    return Case(case_id, plant)


def _canary(ctx: Ctx) -> Path:
    return ctx.outside / "canary.ko"


def _shadow(ctx: Ctx) -> Path:
    return SHADOW


def _dangling(ctx: Ctx) -> Path:
    return ctx.outside / "nothing-here"


def _self(ctx: Ctx) -> str:
    return "ms_exporter.ko"


def _outside_dir(ctx: Ctx) -> Path:
    return ctx.outside


def _relative_escape(ctx: Ctx) -> str:
    depth = len(ctx.drop.relative_to(ctx.outside.parent).parts) + 1
    return "../" * depth + "outside/canary.ko"


def _two_loop(ctx: Ctx) -> list[str | re.Pattern[str]]:
    ctx.replace_with(M, lambda p: p.symlink_to("loop.ko"))
    (ctx.drop / "modules/loop.ko").symlink_to("ms_exporter.ko")
    return [f"{ctx.d}/{M}: is a symbolic link"]


def _inner_hardlink(ctx: Ctx) -> list[str | re.Pattern[str]]:
    os.link(ctx.drop / M, ctx.drop / "modules/unlisted.ko")
    return [f"{ctx.d}/{M}: has 2 hard links (a drop file must have one)"]


def _manifest_kind(case_id: str, make: Callable[[Path], object], why: str) -> Case:
    def plant(ctx: Ctx) -> list[str | re.Pattern[str]]:
        moved_out(ctx, MANIFEST_NAME)
        make(ctx.drop / MANIFEST_NAME)
        return [f"{ctx.m}: {why}"]

    return Case(case_id, plant)


def _manifest_link(ctx: Ctx) -> list[str | re.Pattern[str]]:
    out = moved_out(ctx, MANIFEST_NAME)
    (ctx.drop / MANIFEST_NAME).symlink_to(out)
    return [f"{ctx.m}: is a symbolic link"]


def _manifest_hardlink(ctx: Ctx) -> list[str | re.Pattern[str]]:
    out = moved_out(ctx, MANIFEST_NAME)
    os.link(out, ctx.drop / MANIFEST_NAME)
    return [f"{ctx.m}: has 2 hard links (a drop file must have one)"]


def _sparse(rel: str, size: int, limit: int) -> Plant:
    def plant(ctx: Ctx) -> list[str | re.Pattern[str]]:
        os.truncate(ctx.drop / rel, size)
        return [f"{ctx.d}/{rel}: is {size} bytes, over the limit of {limit}"]

    return plant


def _total(ctx: Ctx) -> list[str | re.Pattern[str]]:
    os.truncate(ctx.drop / F, 3 << 20)
    left = (3 << 20) - (ctx.drop / M).stat().st_size
    return [
        f"{ctx.d}/{F}: is {3 << 20} bytes, over the {left} bytes left "
        f"of the drop's total limit of {3 << 20}"
    ]


def _manifest_over_config(ctx: Ctx) -> list[str | re.Pattern[str]]:
    size = (ctx.drop / MANIFEST_NAME).stat().st_size
    return [f"{ctx.d}/manifest.toml: is {size} bytes, over the limit of 64"]


def _huge(ctx: Ctx) -> list[str | re.Pattern[str]]:
    raw = (ctx.drop / MANIFEST_NAME).read_bytes()
    raw += b"#" * ((1 << 20) + 1 - len(raw) - 1) + b"\n"
    ctx.rewrite(raw)
    return [f"{ctx.d}/manifest.toml: is {1 << 20 | 1} bytes, over the limit of {1 << 20}"]


def _tables(key: str, n: int) -> Plant:
    def plant(ctx: Ctx) -> list[str | re.Pattern[str]]:
        data = ctx.manifest()
        entry = data[key][0]  # type: ignore[index]
        data[key] = [
            {
                **entry,
                "file": f"{entry['file'].rsplit('/', 1)[0]}/f{i}.{'ko' if key == 'module' else 'bin'}",
            }
            for i in range(n)
        ]
        ctx.rewrite(data)
        return [f"{ctx.m}: {key}: more than {n - 1} entries"]

    return plant


FILE_CASES = [
    # symbolic links
    _sym(M, _canary),
    _sym(M, _shadow),
    _sym(M, _dangling),
    _sym(M, _self),
    _sym(M, _outside_dir),
    _sym(M, _relative_escape),
    Case("symlink-loop-of-two", _two_loop),
    _sym(F, _canary),
    _sym(F, _shadow),
    _dir_symlink("symlink-modules-dir", "modules", M),
    _dir_symlink("symlink-firmware-dir", "firmware", F),
    _dir_symlink("symlink-firmware-subdir", "firmware/fw", F),
    Case("symlink-manifest", _manifest_link),
    Case("symlink-drop-dir", _drop_is_symlink),
    # hard links
    _hardlink("hardlink-module-outside", M),
    _hardlink("hardlink-firmware-outside", F),
    Case("hardlink-manifest-outside", _manifest_hardlink),
    Case("hardlink-inside-drop", _inner_hardlink),
    # FIFOs, sockets, devices, directories, missing files
    _kind("fifo-module", M, os.mkfifo, "is a FIFO, not a regular file"),
    _kind("fifo-firmware", F, os.mkfifo, "is a FIFO, not a regular file"),
    _manifest_kind("fifo-manifest", os.mkfifo, "is a FIFO, not a regular file"),
    Case(
        "fifo-as-modules-dir",
        lambda ctx: (ctx.replace_with("modules", os.mkfifo), [f"{ctx.d}/{M}: {NOTDIR}"])[1],
    ),
    _kind("socket-module", M, mknod(stat.S_IFSOCK, 0, 0), "is a socket, not a regular file"),
    _manifest_kind(
        "socket-manifest", mknod(stat.S_IFSOCK, 0, 0), "is a socket, not a regular file"
    ),
    _kind(
        "chardev-null-module", M, mknod(stat.S_IFCHR, 1, 3), "is a device node, not a regular file"
    ),
    _kind(
        "chardev-zero-module", M, mknod(stat.S_IFCHR, 1, 5), "is a device node, not a regular file"
    ),
    _kind(
        "chardev-full-firmware",
        F,
        mknod(stat.S_IFCHR, 1, 7),
        "is a device node, not a regular file",
    ),
    _kind(
        "blockdev-loop-module",
        M,
        mknod(stat.S_IFBLK, 7, 0),
        "is a device node, not a regular file",
    ),
    _manifest_kind(
        "chardev-zero-manifest", mknod(stat.S_IFCHR, 1, 5), "is a device node, not a regular file"
    ),
    _kind("directory-as-module", M, os.mkdir, "is a directory, not a regular file"),
    _manifest_kind("directory-as-manifest", os.mkdir, "is a directory, not a regular file"),
    _kind("missing-module", M, lambda p: None, "does not exist"),
    _kind("missing-firmware", F, lambda p: None, "does not exist"),
    # sizes and counts
    Case("sparse-module-3GiB", _sparse(M, 3 << 30, 2 << 30)),
    Case(
        "sparse-firmware-over-config",
        _sparse(F, 2 << 20, 1 << 20),
        Config(limits=Limits(max_file_bytes=1 << 20)),
    ),
    Case("total-bytes-over-config", _total, Config(limits=Limits(max_total_bytes=3 << 20))),
    Case("sparse-manifest-2MiB", _sparse(MANIFEST_NAME, 2 << 20, 1 << 20)),
    Case("huge-manifest-1MiB+1", _huge),
    Case(
        "manifest-over-config",
        _manifest_over_config,
        Config(limits=Limits(max_manifest_bytes=64)),
    ),
    Case(
        "files-over-config",
        lambda ctx: [f"{ctx.d}: names 2 files, over the limit of 1"],
        Config(limits=Limits(max_files=1)),
    ),
    Case("firmware-4097-entries", _tables("firmware", 4097)),
    Case("module-257-entries", _tables("module", 257)),
]

"""The drop protocol: what ``modstage stage`` writes into the incoming directory.

A drop is a directory ``<bundle>.<time>.<token>`` holding the files under
``modules/`` and ``firmware/`` and, written last by rename, ``manifest.toml``.
Until the manifest exists the drop is incomplete and every reader ignores it,
so a stager killed at any point leaves nothing that looks complete. A finished
drop removes the older drops of its bundle built for the same kernel, and those whose
manifest names no kernel (incomplete, unreadable); a drop for another kernel stays (it
covers that kernel), and drops of other bundles are never touched.
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import os
import secrets
import shutil
import stat
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import BinaryIO, TextIO

from stager.schema.atomic import fsync_dir, fsync_file, write_atomic
from stager.schema.failures import ManifestError, StageError
from stager.schema.manifest import MAX_MANIFEST_BYTES, SCHEMA, FirmwareEntry, Manifest, ModuleEntry
from stager.schema.modfile import HEAD, Unchecked, compression, elf_problem, payload_head
from stager.schema.params import ParamsError, merge_params, parse_params
from stager.schema.paths import (
    DIGEST_NAME,
    MANIFEST_NAME,
    drop_name,
    parse_drop_name,
    strip_module_suffix,
)
from stager.staged import remember

CHUNK = 1 << 20
MODE_MASK = 0o644  # a copy is never executable, never writable by others, never wider


@dataclass(frozen=True)
class ModuleSpec:
    """A module named on the command line: its source file and explicit parameters."""

    source: Path
    params: str = ""

    @classmethod
    def parse(cls, spec: str) -> ModuleSpec:
        """``FILE`` or ``FILE:PARAMS`` (split at the first ':')."""
        file, _, params = spec.partition(":")
        try:
            parse_params(params)
        except ParamsError as exc:
            raise StageError(file, f"parameters {params!r}: {exc}") from exc
        return cls(Path(file), params)

    @property
    def stem(self) -> str:
        """The file name without its module suffix, as the GPU operator names conf files."""
        return strip_module_suffix(self.source.name)


def conf_params(params_dir: Path, stem: str) -> str:
    """Parameters from ``<stem>.conf`` (either '-' or '_' spelling), '' when absent.

    One or more space-separated parameters per line, the last newline optional,
    as the GPU operator's kernelModuleConfig writes them; blank lines and lines
    starting with '#' are skipped.
    """
    for name in dict.fromkeys((stem, stem.replace("_", "-"), stem.replace("-", "_"))):
        path = params_dir / f"{name}.conf"
        try:
            text = path.read_text(encoding="utf-8")
        except FileNotFoundError:
            continue
        except (OSError, UnicodeDecodeError) as exc:
            raise StageError(path, f"cannot read parameters: {exc}") from exc
        lines = [ln.strip() for ln in text.splitlines()]
        params = " ".join(ln for ln in lines if ln and not ln.startswith("#"))
        try:
            parse_params(params)
        except ParamsError as exc:
            raise StageError(path, f"not a kernel parameter string: {exc}") from exc
        return params
    return ""


def _rmtree(path: Path) -> None:
    shutil.rmtree(path, ignore_errors=True)


def firmware_files(root: Path) -> list[tuple[Path, str]]:
    """Every regular file under ``root`` with its relative path, sorted. A symlinked file
    is copied from the file it leads to, by that file's real path, only if that lies under
    ``root`` too (linux-firmware links one name to another); one leading outside (to
    ``/etc/shadow``) is refused, as is a symlinked directory."""
    if not root.is_dir():
        raise StageError(root, "firmware directory does not exist or is not a directory")
    real_root = os.path.realpath(root)
    found: list[tuple[Path, str]] = []
    for dirpath, dirnames, filenames in os.walk(root, onerror=_walk_error):
        for name in dirnames:
            if (Path(dirpath) / name).is_symlink():
                raise StageError(
                    Path(dirpath) / name,
                    "symlinked firmware directories are not supported; copy the files instead",
                )
        for name in filenames:
            path = Path(dirpath) / name
            found.append((_inside(path, real_root, root), path.relative_to(root).as_posix()))
    return sorted(found, key=lambda item: item[1])


def _inside(path: Path, real_root: str, root: Path) -> Path:
    """``path``, or for a symlink the real path of the file it leads to, if that lies under
    ``real_root``; else :class:`StageError` naming the symlink."""
    if not path.is_symlink():
        return path
    real = os.path.realpath(path)
    if os.path.commonpath([real_root, real]) != real_root:
        raise StageError(
            path,
            f"a symlink leading outside the firmware directory {root} (to {real}): refused; "
            "copy the file into the directory instead",
        )
    return Path(real)


def _walk_error(exc: OSError) -> None:
    raise StageError(exc.filename, f"cannot list firmware directory: {exc.strerror}")


def copy_hashed(source: Path, dest: Path) -> str:
    """Copy one regular file durably; return the sha256 of what was written. The copy's
    mode is the source's masked with :data:`MODE_MASK`: never wider than the source."""
    try:
        src = os.open(source, os.O_RDONLY | os.O_CLOEXEC)
    except OSError as exc:
        raise StageError(source, f"cannot open: {exc.strerror}") from exc
    digest = hashlib.sha256()
    try:
        mode = os.fstat(src).st_mode
        if not stat.S_ISREG(mode):
            raise StageError(source, "not a regular file")
        dest.parent.mkdir(parents=True, exist_ok=True)
        out = os.open(dest, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, mode & MODE_MASK)
        with os.fdopen(src, "rb", closefd=False) as reader, os.fdopen(out, "wb") as writer:
            buf = bytearray(CHUNK)
            view = memoryview(buf)
            while n := reader.readinto(buf):
                digest.update(view[:n])
                writer.write(view[:n])
            writer.flush()
            fsync_file(writer.fileno())
    except OSError as exc:
        raise StageError(exc.filename or source, f"cannot copy: {exc.strerror}") from exc
    finally:
        os.close(src)
    return digest.hexdigest()


def stage(
    into: Path,
    *,
    bundle: str,
    version: str,
    kernel: str,
    modules: list[ModuleSpec],
    params_dir: Path | None = None,
    firmware_dirs: tuple[Path, ...] = (),
    after: tuple[str, ...] = (),
    memory: str | None = None,
    config_digest: str | None = None,
    warn: Callable[[str], None] = lambda note: None,
) -> Path:
    """Write a complete drop for ``bundle`` into ``into`` and return its path.

    Every input is checked before the drop directory is created; a failure while
    writing (a full or read-only file system) removes the partial drop. Either way
    the error is one :class:`StageError` naming the file and the reason.
    """
    header = _header(bundle, version, kernel, after, memory)
    params, fw_sources = _checked(
        into, header, modules, params_dir, firmware_dirs, config_digest, warn
    )
    drop = into / drop_name(bundle, time.time_ns(), secrets.token_hex(8))
    try:
        drop.mkdir(mode=0o755)
    except OSError as exc:
        raise StageError(into, f"cannot create a drop: {exc.strerror}") from exc
    try:
        _fill(drop, header, list(zip(modules, params, strict=True)), fw_sources, config_digest)
        fsync_dir(into)
    except OSError as exc:
        remove_drop(drop)
        raise StageError(exc.filename or drop, f"cannot write the drop: {exc.strerror}") from exc
    except BaseException:
        remove_drop(drop)  # a failed stager leaves nothing behind
        raise
    supersede(into, drop, kernel)
    return drop


def _checked(
    into: Path,
    header: dict[str, object],
    modules: list[ModuleSpec],
    params_dir: Path | None,
    firmware_dirs: tuple[Path, ...],
    config_digest: str | None,
    warn: Callable[[str], None],
) -> tuple[list[str], list[tuple[Path, str]]]:
    """Check every input before anything is written; the modules' merged parameters and
    the firmware files (source, relative path)."""
    if not modules:
        raise StageError("--module", "a bundle needs at least one module")
    if not into.is_dir():
        raise StageError(into, "incoming directory does not exist")
    _validated(header, [ModuleEntry("modules/x.ko", "0" * 64)], [])  # fail before copying
    for spec in modules:
        if (note := _check_module(spec.source)) is not None:
            warn(note)
    if params_dir is not None and not params_dir.is_dir():
        raise StageError(params_dir, "parameters directory does not exist or is not a directory")
    if config_digest is not None and not _digest_ok(config_digest):
        raise StageError("--config-digest", f"{config_digest!r} is not one printable word")
    fw_sources = [item for root in firmware_dirs for item in firmware_files(root)]
    for src, _rel in fw_sources:
        _check_readable(src, "firmware file")
    params = []
    for spec in modules:
        from_conf = conf_params(params_dir, spec.stem) if params_dir else ""
        params.append(merge_params(from_conf, spec.params))
    return params, fw_sources


def _fill(
    drop: Path,
    header: dict[str, object],
    modules: list[tuple[ModuleSpec, str]],
    fw_sources: list[tuple[Path, str]],
    config_digest: str | None,
) -> None:
    """Copy and hash the files, make them durable, then write the manifest last."""
    entries = [
        ModuleEntry(
            f"modules/{spec.source.name}",
            copy_hashed(spec.source, drop / "modules" / spec.source.name),
            params,
        )
        for spec, params in modules
    ]
    fw_entries = [
        FirmwareEntry(f"firmware/{rel}", copy_hashed(src, drop / "firmware" / rel))
        for src, rel in fw_sources
    ]
    for directory, _dirs, _files in os.walk(drop, topdown=False):
        fsync_dir(Path(directory))  # every entry, deepest first, before the manifest
    manifest = _validated(header, entries, fw_entries)
    if config_digest is not None:
        write_atomic(drop / DIGEST_NAME, config_digest.encode() + b"\n")
    write_atomic(drop / MANIFEST_NAME, manifest.to_toml())


def remove_drop(drop: Path, rmtree: Callable[[Path], None] = _rmtree) -> None:
    """Remove a drop, its manifest first, as the host's intake does: a drop left half
    removed (an error, a kill) is incomplete, and every reader ignores it."""
    if drop.is_symlink():  # not a drop: the link goes, never what it leads to
        drop.unlink(missing_ok=True)
        return
    with contextlib.suppress(OSError):  # absent, or a directory: rmtree takes it
        fd = os.open(drop, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
        try:
            os.unlink(MANIFEST_NAME, dir_fd=fd)
        finally:
            os.close(fd)
        fsync_dir(drop)
    rmtree(drop)


def _check_readable(path: Path, what: str) -> None:
    """``path`` is a regular file this process can open, or :class:`StageError`."""
    try:
        if not stat.S_ISREG(os.stat(path).st_mode):
            raise StageError(path, "not a regular file")
        os.close(os.open(path, os.O_RDONLY | os.O_CLOEXEC))
    except OSError as exc:
        raise StageError(path, f"cannot open: {exc.strerror}") from exc


def _check_module(path: Path) -> str | None:
    """``path`` is a readable regular file that looks like a kernel module, compressed ones
    by the start of their payload (:mod:`stager.schema.modfile`), or :class:`StageError` (a
    symlink to ``/etc/shadow``, plain or compressed, is refused, never copied). Returns a
    note when the payload could not be checked (a ``.ko.zst`` without ``zstandard``)."""
    _check_readable(path, "module")
    try:
        with open(path, "rb") as f:
            head = f.read(HEAD)
            suffix, why = compression(head, path.name)
            if why is None and suffix is None:
                why = elf_problem(head)
            elif why is None and suffix is not None:
                f.seek(0)
                why = _payload_problem(f, suffix)
    except Unchecked as exc:
        return f"{path}: its zstd payload cannot be checked ({exc}); accepted by its magic"
    except OSError as exc:
        raise StageError(path, f"cannot read: {exc.strerror}") from exc
    if why is not None:
        raise StageError(path, f"refused as a module: {why}")
    return None


def _payload_problem(f: BinaryIO, suffix: str) -> str | None:
    """Why the compressed module file ``f`` does not hold a kernel module, or None."""
    try:
        payload = payload_head(f, suffix)
    except ValueError as exc:
        return f"not a valid {suffix} file: {exc}"
    why = elf_problem(payload)
    return None if why is None else f"its {suffix} payload is {why[:1].lower()}{why[1:]}"


def _digest_ok(text: str) -> bool:
    """One printable ASCII word of at most 256 characters (what the host accepts)."""
    return 0 < len(text) <= 256 and text.isascii() and text.isprintable() and " " not in text


def _header(
    bundle: str, version: str, kernel: str, after: tuple[str, ...], memory: str | None
) -> dict[str, object]:
    """The manifest's scalar keys, as the container gave them."""
    header: dict[str, object] = {
        "schema": SCHEMA,
        "bundle": bundle,
        "version": version,
        "kernel": kernel,
        "after": list(after),
    }
    if memory is not None:
        header["memory"] = {"auto_online_blocks": memory}
    return header


def _validated(
    header: dict[str, object], modules: list[ModuleEntry], firmware: list[FirmwareEntry]
) -> Manifest:
    """The manifest, through the one validation every reader applies."""
    data = {
        **header,
        "module": [asdict(m) for m in modules],
        "firmware": [asdict(f) for f in firmware],
    }
    try:
        return Manifest.from_dict(data, source="manifest")
    except ManifestError as exc:
        raise StageError(exc.source, "; ".join(exc.problems)) from exc


def supersede(into: Path, drop: Path, kernel: str) -> list[Path]:
    """Remove the drops of ``drop``'s bundle that are older than it and built for its
    ``kernel``, or whose manifest names no kernel (:func:`drop_kernel`: absent, unreadable);
    return them. An older drop for another kernel stays: it covers that kernel."""
    mine = parse_drop_name(drop.name)
    assert mine is not None
    removed = []
    for entry in into.iterdir():
        other = parse_drop_name(entry.name)
        if not other or other[0] != mine[0] or other[1] >= mine[1]:
            continue
        if drop_kernel(entry) in (kernel, None):
            remove_drop(entry)
            removed.append(entry)
    return removed


def drop_kernel(drop: Path) -> str | None:
    """The kernel ``drop``'s manifest names, read as the host reads a container's drop: no
    symbolic link followed (the drop, its manifest), only a singly linked regular file,
    checked before it is opened for reading (through ``/proc/self/fd``), at most
    :data:`MAX_MANIFEST_BYTES`. None when the manifest is absent, cannot be read or parsed,
    or names another bundle."""
    named = parse_drop_name(drop.name)
    try:
        top = os.open(drop, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
        try:
            inode = os.open(MANIFEST_NAME, os.O_PATH | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=top)
        finally:
            os.close(top)
        try:
            st = os.fstat(inode)
            if not stat.S_ISREG(st.st_mode) or st.st_nlink != 1:
                return None  # a FIFO or device is never opened for reading
            fd = os.open(f"/proc/self/fd/{inode}", os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
        finally:
            os.close(inode)
        try:
            raw = os.read(fd, MAX_MANIFEST_BYTES + 1)
        finally:
            os.close(fd)
        manifest = Manifest.from_toml(raw, source=str(drop / MANIFEST_NAME))
    except (OSError, ManifestError):
        return None
    return manifest.kernel if named and manifest.bundle == named[0] else None


def run(args: argparse.Namespace, out: TextIO) -> int:
    """``modstage stage``: stage a drop and print its path."""
    drop = stage(
        args.into,
        bundle=args.bundle,
        version=args.bundle_version,
        kernel=args.kernel,
        modules=[ModuleSpec.parse(spec) for spec in args.module],
        params_dir=args.params_dir,
        firmware_dirs=tuple(args.firmware),
        after=tuple(args.after),
        memory=args.memory,
        config_digest=args.config_digest,
        warn=lambda note: print(f"modstage stage: note: {note}", file=sys.stderr),
    )
    remember(drop, Manifest.read(drop).digest)  # ``wait --bundle`` waits for this drop
    print(drop, file=out)
    return 0

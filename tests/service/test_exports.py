"""The target's exports read from its own files (vmlinuz, in-tree modules), the cache, and
what a damaged input does: a clear error naming the file, and the next source used."""

from __future__ import annotations

import lzma
import shutil
import struct
from pathlib import Path

import pytest

from service.errors import TargetFileError
from service.layout import Layout
from service.verify.targetkernel.exports import KernelExports, Sources, build, load, read_symvers
from service.verify.targetkernel.exports_cache import CACHE_FORMAT
from service.verify.targetkernel.kernel import Target
from service.verify.targetkernel.kimage import read_image, vmlinux
from tests.kmod.build import HEADERS

REAL_IMAGE = Path("/boot")
REAL_MODULES = Path("/lib/modules")


def _sources(root: Path, release: str, *, symvers: bool, image: Path | None = None) -> Sources:
    """A root with the real image (or ``image``) and in-tree tree; Module.symvers if asked."""
    modules = root / "lib/modules" / release
    modules.mkdir(parents=True)
    (modules / "kernel").symlink_to(REAL_MODULES / release / "kernel")
    shutil.copyfile(REAL_MODULES / release / "modules.dep", modules / "modules.dep")
    if symvers:
        (modules / "build").mkdir()
        shutil.copyfile(
            HEADERS / f"linux-headers-{release}/Module.symvers", modules / "build/Module.symvers"
        )
    boot = root / "boot"
    boot.mkdir()
    target = boot / f"vmlinuz-{release}"
    if image is None:
        target.symlink_to(REAL_IMAGE / f"vmlinuz-{release}")
    else:
        shutil.copyfile(image, target)
    (root / "var/lib/modstage").mkdir(parents=True)
    layout = Layout(root)
    return Sources(target, modules, layout.exports_cache(release))


def test_kernel_files_give_every_export_as_module_symvers_does(kernel: str, tmp_path: Path) -> None:
    """Symbol by symbol, the table read from vmlinuz and the in-tree modules equals the
    headers' Module.symvers: the same symbols, CRCs, GPL-only flags, namespaces, owners."""
    table = build(_sources(tmp_path, kernel, symvers=False))
    listed = read_symvers(HEADERS / f"linux-headers-{kernel}/Module.symvers")
    assert table.complete and not table.problems and not table.disagree
    assert len(listed) > 20000
    assert dict(table.symbols) == listed


def test_both_sources_read_are_cross_checked_and_agree(kernel: str, tmp_path: Path) -> None:
    """With the headers installed, Module.symvers is read beside the kernel's files; on
    Debian's own kernel the two agree on every CRC."""
    table = build(_sources(tmp_path, kernel, symvers=True))
    assert table.sources[0].endswith(f"vmlinuz-{kernel}")
    assert table.sources[-1].endswith("build/Module.symvers") and not table.disagree


def test_a_disagreeing_module_symvers_is_named_with_both_files(kernel: str, tmp_path: Path) -> None:
    """A Module.symvers giving another CRC than vmlinuz for a symbol is a disagreement that
    names both files and both CRCs."""
    sources = _sources(tmp_path, kernel, symvers=True)
    lines = sources.symvers.read_text().splitlines()
    at = next(i for i, line in enumerate(lines) if line.split("\t")[1] == "_printk")
    crc, rest = lines[at].split("\t", 1)
    lines[at] = f"{int(crc, 16) ^ 1:#010x}\t{rest}"
    sources.symvers.write_text("\n".join(lines) + "\n")
    said = build(sources).disagree["_printk"]
    assert str(sources.image) in said and str(sources.symvers) in said
    assert f"{int(crc, 16):#010x}" in said and f"{int(crc, 16) ^ 1:#010x}" in said


@pytest.mark.parametrize(
    ("label", "damage", "why"),
    [
        ("truncated", lambda d: d[: len(d) // 2], "payload"),
        ("unknown payload format", lambda d: _with_payload_head(d, b"BZh9"), "unknown payload"),
        ("not a kernel", lambda d: b"MZ" + b"\0" * 4096, "neither a bzImage"),
        ("no sections", lambda d: _image_of(_elf_without_sections(vmlinux(d))), "section"),
    ],
)
def test_a_damaged_image_is_named_and_module_symvers_is_used(
    kernel: str, tmp_path: Path, label: str, damage: object, why: str
) -> None:
    """A damaged vmlinuz gives an error naming the file and the reason; the table then comes
    from the next source (Module.symvers), whole, and nothing crashes."""
    real = (REAL_IMAGE / f"vmlinuz-{kernel}").read_bytes()
    broken = tmp_path / "broken"
    broken.write_bytes(damage(real))  # type: ignore[operator]
    with pytest.raises(TargetFileError, match=why) as caught:
        read_image(broken)
    assert str(broken) in str(caught.value)
    sources = _sources(tmp_path / "root", kernel, symvers=True, image=broken)
    table = build(sources)
    assert table.complete and table.sources == (str(sources.symvers),), label
    assert any(str(sources.image) in p and why in p for p in table.problems), table.problems


def test_without_any_readable_source_the_table_is_incomplete(kernel: str, tmp_path: Path) -> None:
    """No image and no Module.symvers: nothing is claimed complete (the probe's CRCs only)."""
    sources = _sources(tmp_path, kernel, symvers=False)
    sources.image.unlink()
    table = build(sources)
    assert not table.complete and not table.symbols and not table.problems


def test_the_cache_is_built_once_and_read_back_equal(kernel: str, tmp_path: Path) -> None:
    """The first lookup builds and writes the cache (root only); the next reads it back
    unchanged: every symbol as built, the same sources."""
    sources = _sources(tmp_path, kernel, symvers=False)
    built, note = load(sources)
    assert note is None and sources.cache is not None and sources.cache.is_file()
    assert sources.cache.read_bytes().startswith(CACHE_FORMAT)
    assert oct(sources.cache.stat().st_mode & 0o777) == "0o600"
    written = sources.cache.stat().st_mtime_ns
    cached, note = load(sources)
    assert sources.cache.stat().st_mtime_ns == written  # read, not rebuilt
    assert note is None and dict(cached.symbols) == dict(built.symbols)
    assert cached.sources == built.sources and cached.complete


@pytest.mark.parametrize(
    "damage",
    [
        lambda d: d[: len(d) - 100],
        lambda d: d[:-50] + bytes(50),
        lambda d: b"garbage",
        lambda d: b"",
    ],
)
def test_a_damaged_cache_is_rebuilt_and_said(kernel: str, tmp_path: Path, damage: object) -> None:
    """A truncated, corrupted or foreign cache file is not trusted: the table is rebuilt
    from the kernel's files (equal to the first build), and the note names the cache."""
    sources = _sources(tmp_path, kernel, symvers=False)
    built, _ = load(sources)
    assert sources.cache is not None
    sources.cache.write_bytes(damage(sources.cache.read_bytes()))  # type: ignore[operator]
    again, note = load(sources)
    assert note is not None and str(sources.cache) in note and "rebuilt" in note
    assert dict(again.symbols) == dict(built.symbols)
    assert load(sources)[1] is None  # the rebuilt cache was written whole


def test_a_changed_kernel_file_rebuilds_the_cache(kernel: str, tmp_path: Path) -> None:
    """The cache is keyed by its files' identity: a new modules.dep (depmod ran) rebuilds."""
    sources = _sources(tmp_path, kernel, symvers=False)
    load(sources)
    assert sources.cache is not None
    before = sources.cache.stat().st_mtime_ns
    sources.depmod.write_text(sources.depmod.read_text() + "\n")
    _table, note = load(sources)
    assert note is not None and "built from other files" in note
    assert sources.cache.stat().st_mtime_ns != before


def test_boot_never_reads_the_exports(kernel: str, tmp_path: Path) -> None:
    """A probe-only target (boot's) knows the probed CRCs and reads nothing else: no cache
    is written, even once a symbol is looked up."""
    sources = _sources(tmp_path, kernel, symvers=False)
    target = Target.from_layout(Layout(tmp_path), kernel)
    assert isinstance(target.exports, KernelExports)
    boot = target.probe_only()
    assert "_printk" not in boot.exports and not boot.exports.complete
    assert sources.cache is not None and not sources.cache.exists()
    assert "_printk" in target.exports and sources.cache.exists()


def _with_payload_head(data: bytes, head: bytes) -> bytes:
    setup = ((data[0x1F1] or 4) + 1) * 512
    (offset,) = struct.unpack_from("<I", data, 0x248)
    at = setup + offset
    return data[:at] + head + data[at + len(head) :]


def _elf_without_sections(elf: bytes) -> bytes:
    """``elf`` with e_shnum and e_shoff zeroed (a stripped image)."""
    out = bytearray(elf)
    out[0x28:0x30] = bytes(8)
    out[0x3C:0x3E] = bytes(2)
    return bytes(out)


def _image_of(elf: bytes) -> bytes:
    """A minimal bzImage around ``elf``: setup header, xz payload, size trailer."""
    payload = lzma.compress(elf, format=lzma.FORMAT_XZ, check=lzma.CHECK_CRC32)
    payload += struct.pack("<I", len(elf))
    head = bytearray(1024)  # setup_sects = 1: protected-mode code at 1024
    head[0x1F1] = 1
    head[0x202:0x206] = b"HdrS"
    struct.pack_into("<H", head, 0x206, 0x20F)
    struct.pack_into("<II", head, 0x248, 0, len(payload))
    return bytes(head) + payload


def test_a_quick_lookup_reads_the_cache_or_module_symvers_never_the_kernel(
    kernel: str, tmp_path: Path
) -> None:
    """What boot uses to explain a refused load: the cache when it is current; else
    Module.symvers alone (the image is not read, no cache written); else nothing."""
    sources = _sources(tmp_path, kernel, symvers=True)
    quick = KernelExports(sources, {}).cached_only()
    assert quick.table.sources == (str(sources.symvers),) and quick.complete
    assert sources.cache is not None and not sources.cache.exists()
    sources.symvers.unlink()
    assert not KernelExports(sources, {}).cached_only().complete
    full, _ = load(sources)
    cached = KernelExports(sources, {}).cached_only().table
    assert cached.sources == full.sources and cached.complete

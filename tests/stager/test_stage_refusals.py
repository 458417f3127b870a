"""Every bad input a driver container can meet: one clear line, exit 1, never a partial drop."""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from service.cli import main
from stager.drop import DIGEST_NAME
from tests.stager.argv import module_bytes, stage_argv


@pytest.fixture
def sources(tmp_path: Path) -> Path:
    """A module, a params directory and a firmware tree."""
    src = tmp_path / "src"
    (src / "firmware").mkdir(parents=True)
    (src / "nvidia.ko").write_bytes(module_bytes(200_000, os.urandom(200_000)))
    (src / "firmware" / "gsp.bin").write_bytes(b"gsp")
    (src / "drivers").mkdir()
    (tmp_path / "incoming").mkdir()
    return src


def _mount_tmpfs(where: Path, options: str) -> None:
    where.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", options, "tmpfs", str(where)], check=True)


@pytest.fixture
def small_fs(tmp_path: Path) -> Iterator[tuple[Path, Path]]:
    """(a 64 KiB tmpfs, a read-only tmpfs), unmounted afterwards (the tests run as root)."""
    full, ro = tmp_path / "full", tmp_path / "ro"
    _mount_tmpfs(full, "size=64k")
    _mount_tmpfs(ro, "ro,size=64k")
    try:
        yield full, ro
    finally:
        subprocess.run(["umount", str(full)], check=False)
        subprocess.run(["umount", str(ro)], check=False)


def _stage(into: Path, *extra: str) -> list[str]:
    return stage_argv(into, *extra)


def _one_line(capsys: pytest.CaptureFixture[str]) -> str:
    err = capsys.readouterr().err
    assert err.count("\n") == 1, err
    return err


def test_missing_params_dir_is_refused(
    sources: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """``--params-dir`` naming nothing exits 1 with one line (it used to be skipped)."""
    argv = _stage(tmp_path / "incoming", "--module", f"{sources}/nvidia.ko")
    assert main([*argv, "--params-dir", f"{sources}/nope"]) == 1
    err = _one_line(capsys)
    assert f"{sources}/nope: parameters directory does not exist" in err
    assert list((tmp_path / "incoming").iterdir()) == []


def test_unreadable_params_file_is_refused(
    sources: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A params file that cannot be read (here a directory) is named, nothing is dropped."""
    (sources / "drivers" / "nvidia.conf").mkdir()
    argv = _stage(tmp_path / "incoming", "--module", f"{sources}/nvidia.ko")
    assert main([*argv, "--params-dir", f"{sources}/drivers"]) == 1
    assert f"{sources}/drivers/nvidia.conf: cannot read parameters" in _one_line(capsys)
    assert list((tmp_path / "incoming").iterdir()) == []


def test_missing_firmware_and_module_are_refused_before_any_copy(
    sources: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A missing module after a good one, or a missing firmware dir: no drop directory at all."""
    argv = _stage(tmp_path / "incoming", "--module", f"{sources}/nvidia.ko")
    assert main([*argv, "--module", f"{sources}/gone.ko"]) == 1
    assert f"{sources}/gone.ko: cannot open: No such file or directory" in _one_line(capsys)
    assert main([*argv, "--firmware", f"{sources}/nofw"]) == 1
    assert f"{sources}/nofw: firmware directory does not exist" in _one_line(capsys)
    assert list((tmp_path / "incoming").iterdir()) == []


def test_full_drop_directory_leaves_no_partial_drop(
    sources: Path, small_fs: tuple[Path, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    """ENOSPC while copying is one line naming the file; the partial drop is removed."""
    full, _ro = small_fs
    assert main(_stage(full, "--module", f"{sources}/nvidia.ko")) == 1
    assert "No space left on device" in _one_line(capsys)
    assert list(full.iterdir()) == []


def test_read_only_drop_directory_is_refused(
    sources: Path, small_fs: tuple[Path, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    """A read-only incoming directory is one line naming it."""
    _full, ro = small_fs
    assert main(_stage(ro, "--module", f"{sources}/nvidia.ko")) == 1
    assert f"{ro}: cannot create a drop: Read-only file system" in _one_line(capsys)


def test_config_digest_is_written_and_checked(
    sources: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """``--config-digest`` lands in the drop before its manifest; a spaced value is refused."""
    into = tmp_path / "incoming"
    argv = _stage(into, "--module", f"{sources}/nvidia.ko")
    assert main([*argv, "--config-digest", "a b"]) == 1
    assert "--config-digest: 'a b' is not one printable word" in _one_line(capsys)
    assert main([*argv, "--config-digest", "4093727012"]) == 0
    [drop] = into.iterdir()
    assert (drop / DIGEST_NAME).read_text() == "4093727012\n"


def test_a_file_that_is_not_a_kernel_module_is_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """``--module`` naming a symlink to a secret (``/etc/shadow``), a text file, an ELF
    executable or a ``.ko.xz`` that is not xz is refused with exit 1, naming the file, and
    nothing is copied into incoming."""
    into = tmp_path / "incoming"
    into.mkdir()
    secret = tmp_path / "shadow"
    secret.write_text("root:$6$secret:19000:0:99999:7:::\n")
    secret.chmod(0o640)
    (tmp_path / "nvidia.ko").symlink_to(secret)
    executable = bytearray(module_bytes())
    executable[16:18] = (2).to_bytes(2, "little")  # ET_EXEC
    (tmp_path / "exec.ko").write_bytes(bytes(executable))
    (tmp_path / "fake.ko.xz").write_bytes(module_bytes())
    for name in ("nvidia.ko", "exec.ko", "fake.ko.xz"):
        assert main(_stage(into, "--module", str(tmp_path / name))) == 1
        assert str(tmp_path / name) in _one_line(capsys)
    assert list(into.iterdir()) == []


def test_a_staged_copy_is_never_wider_than_its_source(tmp_path: Path) -> None:
    """A module or firmware file copied into the drop keeps its source's mode masked with
    0644: a 0600 module stays 0600, a 0755 one becomes 0644."""
    into = tmp_path / "incoming"
    into.mkdir()
    private, wide = tmp_path / "private.ko", tmp_path / "wide.ko"
    for path, mode in ((private, 0o600), (wide, 0o755)):
        path.write_bytes(module_bytes())
        path.chmod(mode)
    (tmp_path / "fw").mkdir()
    (tmp_path / "fw" / "gsp.bin").write_bytes(b"gsp")
    (tmp_path / "fw" / "gsp.bin").chmod(0o640)
    argv = _stage(into, "--module", str(private), "--module", str(wide))
    assert main([*argv, "--firmware", str(tmp_path / "fw")]) == 0
    (drop,) = into.iterdir()
    modes = {p.name: p.stat().st_mode & 0o777 for p in drop.rglob("*") if p.is_file()}
    assert modes["private.ko"] == 0o600 and modes["wide.ko"] == 0o644
    assert modes["gsp.bin"] == 0o640

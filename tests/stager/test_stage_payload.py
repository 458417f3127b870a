"""``modstage stage`` judges a compressed module by the start of its payload, read boundedly,
and copies no firmware symlink that leads outside the firmware directory."""

from __future__ import annotations

import gzip
import io
import lzma
import os
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
import tomli_w
import zstandard

from service.cli import main
from stager.schema.modfile import HEAD, MAX_INPUT, elf_problem, payload_head
from tests.stager.argv import module_bytes, stage_argv

ROOT = Path(__file__).resolve().parents[2]
COMPRESS: dict[str, Callable[[bytes], bytes]] = {
    "xz": lzma.compress,
    "gz": gzip.compress,
    "zst": zstandard.ZstdCompressor().compress,
}
SHADOW = b"root:$y$j9T$abcdefgh$0123456789:19000:0:99999:7:::\n" * 8


def _stage(tmp_path: Path, *extra: str) -> tuple[int, list[Path]]:
    """Stage into a fresh incoming directory; (exit code, what incoming holds)."""
    incoming = tmp_path / "incoming"
    incoming.mkdir(exist_ok=True)
    code = main(stage_argv(incoming, *extra), io.StringIO())
    return code, sorted(incoming.iterdir())


@pytest.mark.parametrize("kind", sorted(COMPRESS))
@pytest.mark.parametrize("plain_name", [False, True])
def test_a_compressed_file_whose_payload_is_no_module_is_refused(
    tmp_path: Path, kind: str, plain_name: bool, capsys: pytest.CaptureFixture[str]
) -> None:
    """xz, gzip or zstd of a file that is not an ELF module (``/etc/shadow``), named
    ``.ko.<kind>`` or plain ``.ko``, is refused with one line naming the file, nothing staged;
    the same compression of a module is taken."""
    name = "nvidia.ko" if plain_name else f"nvidia.ko.{kind}"
    bad = tmp_path / "bad" / name
    bad.parent.mkdir()
    bad.write_bytes(COMPRESS[kind](SHADOW))
    code, left = _stage(tmp_path, "--module", str(bad))
    err = capsys.readouterr().err
    assert code == 1 and left == []
    assert f"{bad}: refused as a module: its .ko.{kind} payload is not an ELF file" in err
    assert len(err.splitlines()) == 1
    good = tmp_path / name
    good.write_bytes(COMPRESS[kind](module_bytes(4096)))
    assert _stage(tmp_path, "--module", str(good))[0] == 0


@pytest.mark.parametrize("kind", sorted(COMPRESS))
def test_the_payload_is_read_boundedly(kind: str) -> None:
    """A 4 MiB module's head comes from at most MAX_INPUT compressed bytes (a few KiB in
    practice), never the whole file; a truncated stream gives no module header."""
    data = COMPRESS[kind](module_bytes(64) + os.urandom(4 << 20))

    class Counting(io.BytesIO):
        read_total = 0

        def read(self, size: int | None = -1) -> bytes:
            got = super().read(size)
            Counting.read_total += len(got)
            return got

    head = payload_head(Counting(data), f".ko.{kind}")
    assert len(head) == HEAD and elf_problem(head) is None
    assert Counting.read_total <= MAX_INPUT < len(data)
    try:
        truncated = payload_head(io.BytesIO(data[:8]), f".ko.{kind}")
    except ValueError:
        return
    assert elf_problem(truncated) is not None


def test_without_zstandard_a_zst_payload_is_accepted_by_magic_and_said_so(
    tmp_path: Path,
) -> None:
    """In a container with the standard library and tomli-w alone, a ``.ko.zst`` cannot be
    decompressed: it is accepted by its magic with a note on stderr saying its payload was
    not checked; an ``.ko.xz`` of the same bad payload is still refused there."""
    lib = tmp_path / "lib"
    shutil.copytree(Path(tomli_w.__file__).parent, lib / "tomli_w")
    env = {"PYTHONPATH": f"{ROOT}:{lib}", "PATH": "/usr/bin:/bin"}
    results = {}
    for kind in ("zst", "xz"):
        module = tmp_path / f"nvidia.ko.{kind}"
        module.write_bytes(COMPRESS[kind](SHADOW))
        incoming = tmp_path / f"incoming-{kind}"
        incoming.mkdir()
        argv = stage_argv(incoming, "--module", str(module))
        results[kind] = subprocess.run(
            [sys.executable, "-S", "-m", "service.cli", *argv],
            env=env,
            capture_output=True,
            text=True,
            check=False,
            timeout=120,
        )
    zst, xz = results["zst"], results["xz"]
    assert zst.returncode == 0, zst.stderr
    assert (
        "its zstd payload cannot be checked" in zst.stderr and "accepted by its magic" in zst.stderr
    )
    assert Path(zst.stdout.strip()).is_dir()
    assert xz.returncode == 1 and "payload is not an ELF file" in xz.stderr


def test_a_firmware_symlink_leading_outside_is_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """``fw/shadow.bin -> /etc/shadow`` (outside the firmware directory) is refused naming
    the symlink, nothing staged; a symlink to a file inside the directory is copied with
    that file's bytes."""
    module = tmp_path / "nvidia.ko"
    module.write_bytes(module_bytes())
    secret = tmp_path / "secret"
    secret.write_bytes(b"not firmware")
    fw = tmp_path / "fw"
    (fw / "nvidia").mkdir(parents=True)
    (fw / "nvidia" / "gsp.bin").write_bytes(b"gsp")
    (fw / "nvidia" / "gsp-alias.bin").symlink_to("gsp.bin")
    (fw / "shadow.bin").symlink_to(secret)
    code, left = _stage(tmp_path, "--module", str(module), "--firmware", str(fw))
    err = capsys.readouterr().err
    assert code == 1 and left == []
    assert f"{fw / 'shadow.bin'}: a symlink leading outside the firmware directory" in err
    (fw / "shadow.bin").unlink()
    code, left = _stage(tmp_path, "--module", str(module), "--firmware", str(fw))
    assert code == 0 and len(left) == 1
    assert (left[0] / "firmware/nvidia/gsp-alias.bin").read_bytes() == b"gsp"
    assert not (left[0] / "firmware/nvidia/gsp-alias.bin").is_symlink()

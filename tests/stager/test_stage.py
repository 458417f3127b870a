"""``modstage stage`` end to end on a temporary directory."""

from __future__ import annotations

import hashlib
import os
import signal
import subprocess
import sys
import time
import tomllib
from pathlib import Path

import pytest

from service.cli import main
from stager.drop import ModuleSpec, remove_drop, stage
from stager.schema.failures import StageError
from stager.schema.paths import MANIFEST_NAME, parse_drop_name
from tests.stager.argv import module_bytes, stage_argv

ROOT = Path(__file__).resolve().parents[2]


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "service.cli", "stage", *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=False,
    )


@pytest.fixture
def sources(tmp_path: Path) -> Path:
    """A driver container's files: three modules, params files and a firmware tree."""
    src = tmp_path / "src"
    (src / "firmware" / "nvidia" / "580.95.05").mkdir(parents=True)
    for name, size in [("nvidia.ko", 4096), ("nvidia-uvm.ko", 1000), ("nvidia-modeset.ko", 10)]:
        (src / name).write_bytes(module_bytes(size, os.urandom(size)))
    (src / "firmware" / "nvidia" / "580.95.05" / "gsp_ga10x.bin").write_bytes(b"gsp" * 100)
    (src / "firmware" / "top.bin").write_bytes(b"")
    drivers = src / "drivers"
    drivers.mkdir()
    (drivers / "nvidia.conf").write_text("NVreg_A=1 NVreg_B=2\n\nNVreg_C=3")  # no last newline
    (drivers / "nvidia-modeset.conf").write_text("NVreg_X=0\n")
    (drivers / "nvidia-peermem.conf").write_text("peer=1\n")  # module not in the bundle
    (tmp_path / "incoming").mkdir()
    return src


def _assert_complete(drop: Path) -> dict[str, object]:
    data = tomllib.loads((drop / "manifest.toml").read_text())
    for entry in data["module"] + data.get("firmware", []):
        assert hashlib.sha256((drop / entry["file"]).read_bytes()).hexdigest() == entry["sha256"]
    return data


def test_stage_end_to_end(sources: Path, tmp_path: Path) -> None:
    """The CLI prints one drop whose manifest parses with tomllib, digests match, params merge."""
    result = _cli(
        "--into",
        str(tmp_path / "incoming"),
        "--bundle",
        "nvidia",
        "--version",
        "580.95.05",
        "--kernel",
        "6.1.0-57-amd64",
        "--module",
        str(sources / "nvidia.ko"),
        "--module",
        str(sources / "nvidia-uvm.ko"),
        "--module",
        f"{sources / 'nvidia-modeset.ko'}:NVreg_X=1 extra",
        "--params-dir",
        str(sources / "drivers"),
        "--firmware",
        str(sources / "firmware"),
        "--memory",
        "online_movable",
    )
    assert result.returncode == 0, result.stderr
    drop = Path(result.stdout.strip())
    assert drop.parent == tmp_path / "incoming"
    assert parse_drop_name(drop.name) is not None
    data = _assert_complete(drop)
    assert [(m["file"], m["params"]) for m in data["module"]] == [
        ("modules/nvidia.ko", "NVreg_A=1 NVreg_B=2 NVreg_C=3"),
        ("modules/nvidia-uvm.ko", ""),
        ("modules/nvidia-modeset.ko", "NVreg_X=1 extra"),
    ]
    assert [f["file"] for f in data["firmware"]] == [
        "firmware/nvidia/580.95.05/gsp_ga10x.bin",
        "firmware/top.bin",
    ]
    assert data["memory"] == {"auto_online_blocks": "online_movable"}
    assert (drop / "modules" / "nvidia.ko").read_bytes() == (sources / "nvidia.ko").read_bytes()


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (
            ["--module", "{src}/missing.ko"],
            "{src}/missing.ko: cannot open: No such file or directory",
        ),
        (["--module", "{src}/firmware"], "{src}/firmware: not a regular file"),
        (
            ["--module", '{src}/nvidia.ko:a="b'],
            "{src}/nvidia.ko: parameters 'a=\"b': unbalanced double quote in 'a=\"b'",
        ),
        (
            ["--module", "{src}/nvidia.ko", "--firmware", "{src}/nope"],
            "{src}/nope: firmware directory does not exist or is not a directory",
        ),
        (
            ["--module", "{src}/nvidia.ko", "--memory", "fast"],
            "manifest: memory.auto_online_blocks: 'fast' is not one of offline|online|online_kernel|online_movable",
        ),
    ],
)
def test_stage_failures_are_one_line(
    sources: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], args: list[str], message: str
) -> None:
    """Each failure prints one line naming the file and the reason, exits 1, leaves no drop."""
    argv = stage_argv(tmp_path / "incoming", *(a.format(src=sources) for a in args))
    assert main(argv) == 1
    err = capsys.readouterr().err
    assert err == f"modstage stage: error: {message.format(src=sources)}\n"
    assert list((tmp_path / "incoming").iterdir()) == []


def test_bad_params_file_names_the_file(sources: Path, tmp_path: Path) -> None:
    """A kernelModuleConfig file that is not a parameter string is named in the error."""
    (sources / "drivers" / "nvidia-uvm.conf").write_text('uvm_x="1\n')
    with pytest.raises(StageError) as info:
        stage(
            tmp_path / "incoming",
            bundle="nvidia",
            version="1",
            kernel="6.1",
            modules=[ModuleSpec(sources / "nvidia-uvm.ko")],
            params_dir=sources / "drivers",
        )
    assert info.value.path == str(sources / "drivers" / "nvidia-uvm.conf")


def test_restaging_supersedes_only_the_same_bundle(sources: Path, tmp_path: Path) -> None:
    """A newer drop removes older drops (complete or partial) of its bundle, nothing else."""
    incoming = tmp_path / "incoming"
    mods = [ModuleSpec(sources / "nvidia.ko")]
    first = stage(incoming, bundle="nvidia", version="1", kernel="6.1", modules=mods)
    other = stage(incoming, bundle="mlnx", version="1", kernel="6.1", modules=mods)
    partial = incoming / "nvidia.00000000000000000001.00"
    partial.mkdir()
    unrelated = incoming / "notes.txt"
    unrelated.write_text("kept")
    second = stage(incoming, bundle="nvidia", version="2", kernel="6.1", modules=mods)
    assert sorted(incoming.iterdir()) == sorted([other, second, unrelated])
    assert not first.exists()
    assert _assert_complete(second)["version"] == "2"


def test_concurrent_stagers_of_different_bundles(sources: Path, tmp_path: Path) -> None:
    """Two stagers running at once for two bundles both end with a complete drop."""
    big = sources / "big.ko"
    big.write_bytes(module_bytes(8 << 20, os.urandom(8 << 20)))
    procs = [
        subprocess.Popen(
            [
                sys.executable,
                "-m",
                "service.cli",
                *stage_argv(tmp_path / "incoming", "--module", str(big), bundle=bundle),
            ],
            cwd=ROOT,
            stdout=subprocess.PIPE,
            text=True,
        )
        for bundle in ("alpha", "beta")
    ]
    drops = [Path(p.communicate(timeout=60)[0].strip()) for p in procs]
    assert [p.returncode for p in procs] == [0, 0]
    assert sorted(d.name.split(".")[0] for d in (tmp_path / "incoming").iterdir()) == [
        "alpha",
        "beta",
    ]
    for drop in drops:
        _assert_complete(drop)


@pytest.mark.parametrize("delay", [0.0, 0.05, 0.15, 0.3, 0.6])
def test_killed_stager_leaves_no_complete_looking_drop(
    sources: Path, tmp_path: Path, delay: float
) -> None:
    """SIGKILL at any moment: every drop holding a manifest is complete and matches it."""
    big = sources / "big.ko"
    with big.open("wb") as f:
        for _ in range(64):
            f.write(os.urandom(1 << 20))
    incoming = tmp_path / "incoming"
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "service.cli",
            *stage_argv(
                incoming,
                "--module",
                str(big),
                "--module",
                str(sources / "nvidia-uvm.ko"),
                "--firmware",
                str(sources / "firmware"),
            ),
        ],
        cwd=ROOT,
        stdout=subprocess.DEVNULL,
    )
    deadline = time.monotonic() + 30
    while not any(incoming.iterdir()) and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.002)
    time.sleep(delay)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    for drop in incoming.iterdir():
        if (drop / "manifest.toml").exists():
            _assert_complete(drop)
    # the next stager of the bundle cleans up whatever the killed one left
    final = stage(
        incoming,
        bundle="nvidia",
        version="2",
        kernel="6.1",
        modules=[ModuleSpec(sources / "nvidia.ko")],
    )
    assert list(incoming.iterdir()) == [final]


def test_a_drop_removed_halfway_no_longer_holds_its_manifest(sources: Path, tmp_path: Path) -> None:
    """The manifest goes first: a removal cut short (a kill, an error) leaves an incomplete drop."""
    incoming = tmp_path / "incoming"
    mods = [ModuleSpec(sources / "nvidia.ko"), ModuleSpec(sources / "nvidia-uvm.ko")]
    drop = stage(incoming, bundle="nvidia", version="1", kernel="6.1", modules=mods)
    seen: list[bool] = []

    def cut_short(path: Path) -> None:  # removes one module, then the remover is killed
        seen.append((path / MANIFEST_NAME).exists())
        (path / "modules" / "nvidia.ko").unlink()

    remove_drop(drop, cut_short)
    assert seen == [False]
    assert (drop / "modules" / "nvidia-uvm.ko").exists()  # half removed, and
    assert not os.path.lexists(drop / MANIFEST_NAME)  # not complete: every reader skips it
    remove_drop(drop)
    assert not drop.exists()

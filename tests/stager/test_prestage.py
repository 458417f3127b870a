"""``nvidia-driver prestage``: a precompiled image stages for the host's next kernel only."""

from __future__ import annotations

import io
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from stager.driver import main, prestage
from stager.drop import DIGEST_NAME
from stager.prestage import Prestage
from stager.schema.failures import StagerError
from stager.schema.manifest import Manifest
from stager.schema.paths import MANIFEST_NAME
from tests.stager.argv import module_bytes

RUNNING = "6.12.57-amd64"  # the node's kernel now
NEXT = "6.12.63-amd64"  # the kernel update's, the image's own (its tag names it)
OTHER = "6.12.69-amd64"  # a kernel the image also carries modules for
DIGEST = "648926272"  # the digest the operator gives NEXT's driver pod


def _carry(root: Path, release: str) -> None:
    mods = root / f"opt/modstage/modules/{release}"
    mods.mkdir(parents=True)
    for name in ("nvidia", "nvidia-modeset", "nvidia-uvm"):
        (mods / f"{name}.ko").write_bytes(module_bytes(100 * len(name), name.encode()))


@pytest.fixture
def root(tmp_path: Path) -> Path:
    """NEXT's precompiled image (and OTHER's modules) plus the pod's mounts: the host's
    /run/nvidia/modstage and /drivers; the node runs RUNNING with a driver loaded."""
    r = tmp_path / "root"
    _carry(r, NEXT)
    _carry(r, OTHER)
    fw = r / "opt/modstage/firmware/nvidia/2.0"
    fw.mkdir(parents=True)
    (fw / "gsp.bin").write_bytes(b"gsp")
    (r / "drivers").mkdir()
    (r / "drivers/nvidia.conf").write_text("NVreg_X=1\n")
    (r / "run/nvidia/modstage/incoming").mkdir(parents=True)
    loaded = r / "sys/module/nvidia"
    loaded.mkdir(parents=True)
    (loaded / "refcnt").write_text("1\n")
    (loaded / "version").write_text("1.0\n")
    return r


def _env(**extra: str) -> dict[str, str]:
    return {
        "DRIVER_VERSION": "2.0",
        "KERNEL_VERSION": NEXT,
        "DRIVER_CONFIG_DIGEST": DIGEST,
        **extra,
    }


def _announce(root: Path, next_kernel: str, cover: str = "none", version: str = "") -> None:
    """``status/_host.json`` as ``service.publish.announce`` writes it."""
    status = root / "run/nvidia/modstage/status"
    status.mkdir(parents=True, exist_ok=True)
    entry = {"next": cover, **({"next_version": version} if version else {})}
    doc = {
        "schema": 1,
        "running_kernel": RUNNING,
        "next_kernel": next_kernel,
        "installed": sorted({RUNNING, next_kernel}),
        "bundles": {"nvidia": entry},
    }
    (status / "_host.json").write_text(json.dumps(doc))


def _drops(root: Path) -> list[Path]:
    return sorted((root / "run/nvidia/modstage/incoming").iterdir())


class Stops:
    """The pod's wait: runs ``each`` before each period's look; stops after ``periods``."""

    def __init__(self, periods: int, each: object = None) -> None:
        self.left, self.each = periods, each

    def __call__(self, _seconds: float) -> bool:
        if callable(self.each):
            self.each()
        self.left -= 1
        return self.left < 0


def _prestage(root: Path, stopped: Stops | None = None) -> tuple[Prestage, io.StringIO]:
    out = io.StringIO()
    return prestage(_env(), out, root, stopped or Stops(0)), out


def test_stages_only_for_the_announced_next_kernel_that_is_its_own(root: Path) -> None:
    """The image is NEXT's and also carries OTHER's modules: nothing is staged for OTHER
    (its digest is NEXT's pod's), nor for the running kernel, nor while the host has this
    version ready for NEXT; for NEXT without a driver one drop, for NEXT, carrying the
    next pod's digest, and only once."""
    prestage, _out = _prestage(root)
    assert prestage.check() is None  # nothing announced yet
    _announce(root, OTHER)
    assert prestage.check() is None and _drops(root) == []
    _announce(root, RUNNING)
    assert prestage.check() is None and _drops(root) == []
    _announce(root, NEXT, cover="ready", version="2.0")
    assert prestage.check() is None and _drops(root) == []
    _announce(root, NEXT)
    name = prestage.check()
    [drop] = _drops(root)
    assert drop.name == name
    assert Manifest.from_toml((drop / MANIFEST_NAME).read_bytes()).kernel == NEXT
    assert (drop / DIGEST_NAME).read_text().strip() == DIGEST
    assert prestage.check() is None and _drops(root) == [drop]


def test_never_unloads_binds_or_becomes_ready(root: Path) -> None:
    """A whole run (a look at start, three periods, then SIGTERM's stop) stages NEXT's drop
    and nothing else: the loaded driver stays, no driver root, no state file, no readiness
    file; it exits 0."""
    _announce(root, NEXT)
    prestage, out = _prestage(root, Stops(3))
    assert prestage.run() == 0
    assert len(_drops(root)) == 1
    assert (root / "sys/module/nvidia/version").read_text() == "1.0\n"
    assert sorted(p.name for p in (root / "run/nvidia").iterdir()) == ["modstage"]
    assert "staging for the next kernel failed" not in out.getvalue()
    assert (
        out.getvalue()
        .rstrip()
        .endswith("stopping; nothing to undo (pre-stage mode changes only its drop)")
    )


def test_refusal_and_failure_are_said_once(root: Path) -> None:
    """The host refuses the drop: its reason is said once over several periods. A failure
    to stage (the host's incoming directory gone) is said once too, not every period."""
    _announce(root, NEXT)
    prestage, out = _prestage(root)
    name = prestage.check()
    assert name is not None
    doc = {
        "bundle": "nvidia",
        "phase": "active",
        "updated": time.time(),
        "errors": [],
        "rejected": {name: "vermagic is for another kernel"},
    }
    (root / "run/nvidia/modstage/status/nvidia.json").write_text(json.dumps(doc))
    for _ in range(3):
        prestage.check()
    assert out.getvalue().count(f"the host refused {name} for kernel {NEXT}: vermagic") == 1

    other = root.parent / "other"
    other.mkdir()
    for path in ("opt", "drivers"):
        os.symlink(root / path, other / path)
    (other / "run/nvidia/modstage/status").mkdir(parents=True)  # no incoming directory
    _announce(other, NEXT)
    fresh, said = _prestage(other, Stops(3))
    assert fresh.run() == 0
    assert said.getvalue().count("staging for the next kernel failed") == 1


def test_the_digest_and_kernel_are_required(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Without DRIVER_CONFIG_DIGEST the drop would make the next pod's init container
    unload the driver after the reboot: the mode refuses to start, naming it; without
    KERNEL_VERSION it has no kernel of its own."""
    with pytest.raises(StagerError, match="DRIVER_CONFIG_DIGEST: not set"):
        prestage({**_env(), "DRIVER_CONFIG_DIGEST": ""}, io.StringIO())
    with pytest.raises(StagerError, match="KERNEL_VERSION: not set"):
        prestage({**_env(), "KERNEL_VERSION": ""}, io.StringIO())
    monkeypatch.setenv("DRIVER_VERSION", "2.0")
    monkeypatch.setenv("KERNEL_VERSION", NEXT)
    monkeypatch.delenv("DRIVER_CONFIG_DIGEST", raising=False)
    assert main(["prestage"]) == 1
    assert capsys.readouterr().err.startswith("nvidia-driver prestage: error: DRIVER_CONFIG")


def test_the_pod_stages_while_it_sleeps_and_stops_on_sigterm(root: Path) -> None:
    """``nvidia-driver prestage`` in a process of its own, as the pod's: it keeps running,
    stages for NEXT within a period of the host announcing it, and exits 0 at SIGTERM."""
    repo = Path(__file__).resolve().parents[2]
    env = {
        **os.environ,
        **_env(MODSTAGE_NEXT_KERNEL_EVERY="0.1"),
        "PYTHONPATH": str(repo),
        "MODSTAGE_DIR": str(root / "run/nvidia/modstage"),
        "MODSTAGE_MODULE_DIR": str(root / f"opt/modstage/modules/{NEXT}"),
        "MODSTAGE_FIRMWARE_DIR": str(root / "opt/modstage/firmware"),
        "MODSTAGE_PARAMS_DIR": str(root / "drivers"),
        "RUN_DIR": str(root / "run/nvidia"),
    }
    proc = subprocess.Popen(
        [sys.executable, "-m", "stager.driver", "prestage"],
        stdout=subprocess.PIPE,
        text=True,
        cwd=repo,
        env=env,
    )
    try:
        time.sleep(0.3)
        assert proc.poll() is None, "the pod exited"
        _announce(root, NEXT)
        deadline = time.monotonic() + 20
        while not _drops(root):
            assert time.monotonic() < deadline, "the pod never staged for NEXT"
            time.sleep(0.05)
        proc.send_signal(signal.SIGTERM)
        out, _ = proc.communicate(timeout=20)
    finally:
        proc.kill()
    assert proc.returncode == 0, out
    assert f"the next boot runs kernel {NEXT}: staged" in out and "stopping" in out

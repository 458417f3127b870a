"""``nvidia-driver``: the GPU operator's driver-container verbs on a temporary root."""

from __future__ import annotations

import io
import json
import shutil
import time
from pathlib import Path

import pytest

from stager.driver import Driver, Settings, loaded_version, main
from stager.drop import DIGEST_NAME
from stager.schema.failures import StagerError
from stager.schema.manifest import Manifest
from stager.schema.paths import MANIFEST_NAME
from tests.stager.argv import module_bytes

KERNEL = "6.1.0-test-amd64"


@pytest.fixture
def root(tmp_path: Path) -> Path:
    """An image plus the pod's host mounts: modules, firmware, /drivers, /run/nvidia, /sys."""
    r = tmp_path / "root"
    mods = r / f"opt/modstage/modules/{KERNEL}"
    mods.mkdir(parents=True)
    for name in ("nvidia", "nvidia-modeset", "nvidia-uvm"):
        (mods / f"{name}.ko").write_bytes(module_bytes(100 * len(name), name.encode()))
    fw = r / "opt/modstage/firmware/nvidia/2.0"
    fw.mkdir(parents=True)
    (fw / "gsp.bin").write_bytes(b"gsp")
    (r / "drivers").mkdir()
    (r / "drivers/nvidia.conf").write_text("NVreg_X=1\n")
    (r / "run/nvidia/modstage/incoming").mkdir(parents=True)
    (r / "sys/module").mkdir(parents=True)
    return r


def _settings(root: Path, **env: str) -> Settings:
    base = {"DRIVER_VERSION": "2.0", "KERNEL_VERSION": KERNEL, "DRIVER_CONFIG_DIGEST": "777"}
    return Settings.from_environ({**base, **env}, root)


def _load(root: Path, module: str, version: str) -> None:
    d = root / "sys/module" / module
    d.mkdir(parents=True, exist_ok=True)
    (d / "refcnt").write_text("0\n")
    (d / "version").write_text(version + "\n")


class Host:
    """Plays the host while the container waits: answers the drop through the status file."""

    def __init__(self, root: Path, verdict: str) -> None:
        self.root, self.verdict, self.calls = root, verdict, 0

    def sleep(self, _seconds: float) -> None:
        self.calls += 1
        assert self.calls < 20, "the container never decided"
        incoming = self.root / "run/nvidia/modstage/incoming"
        drops = list(incoming.iterdir())
        if not drops:
            return
        [drop] = drops
        gen = Manifest.from_toml((drop / MANIFEST_NAME).read_bytes()).digest
        doc: dict[str, object] = {"bundle": "nvidia", "updated": time.time() + 1, "errors": []}
        if self.verdict == "failed":
            doc.update(phase="failed", generation=gen, failed={gen: "nvidia: ENODEV"})
        else:
            doc.update(phase="active", generation=gen, active=gen, failed={})
            _load(self.root, "nvidia", "2.0")
        status = self.root / "run/nvidia/modstage/status"
        status.mkdir(parents=True, exist_ok=True)
        (status / "nvidia.json").write_text(json.dumps(doc))


def _driver(root: Path, host: Host | None = None, **env: str) -> tuple[Driver, io.StringIO]:
    out = io.StringIO()
    mounts: list[list[str]] = []

    def mount(argv: object) -> int:
        mounts.append(list(argv))  # type: ignore[call-overload]
        return 0

    driver = Driver(
        _settings(root, **env),
        out,
        running_kernel=KERNEL,
        mount=mount,
        sleep=host.sleep if host else (lambda _s: None),
        wait_interval=0.0,
    )
    driver.mounts = mounts  # type: ignore[attr-defined]
    return driver, out


def test_loaded_image_version_finishes_like_nvidias_container(root: Path) -> None:
    """Our version loaded: driver root bound, state file = digest, readiness; nothing staged."""
    _load(root, "nvidia", "2.0")
    driver, out = _driver(root)
    assert driver.init(forever=lambda: None) == 0
    assert driver.mounts == [["mount", "--rbind", "/", str(root / "run/nvidia/driver")]]  # type: ignore[attr-defined]
    assert (root / "run/nvidia/nvidia-driver.state").read_bytes() == b"777"
    assert (root / "run/nvidia/validations/.driver-ctr-ready").exists()
    assert list((root / "run/nvidia/modstage/incoming").iterdir()) == []
    assert "nvidia 2.0 is loaded (by the host)" in out.getvalue()


def test_other_version_is_staged_and_the_hosts_failure_reported(root: Path) -> None:
    """v1 loaded: v2 is staged with digest, params, firmware; the host's failure exits 1."""
    _load(root, "nvidia", "1.0")
    host = Host(root, "failed")
    driver, out = _driver(root, host)
    (root / "run/nvidia/validations").mkdir(parents=True)
    (root / "run/nvidia/validations/.driver-ctr-ready").write_text("")
    assert driver.init(forever=lambda: None) == 1
    assert "failed: nvidia: ENODEV" in out.getvalue()
    assert not (root / "run/nvidia/validations/.driver-ctr-ready").exists()
    [drop] = (root / "run/nvidia/modstage/incoming").iterdir()
    manifest = Manifest.from_toml((drop / MANIFEST_NAME).read_bytes())
    assert [m.file for m in manifest.modules] == [
        "modules/nvidia.ko",
        "modules/nvidia-modeset.ko",
        "modules/nvidia-uvm.ko",
    ]
    assert manifest.modules[0].params == "NVreg_X=1"
    assert [f.file for f in manifest.firmware] == ["firmware/nvidia/2.0/gsp.bin"]
    assert (drop / DIGEST_NAME).read_text() == "777\n"
    assert "nvidia 1.0 loaded; staging nvidia 2.0" in out.getvalue()


def test_active_after_waiting_finishes(root: Path) -> None:
    """When the host reports the generation active and it is loaded, init finishes."""
    host = Host(root, "active")
    driver, out = _driver(root, host)
    assert driver.init(forever=lambda: None) == 0
    assert (root / "run/nvidia/validations/.driver-ctr-ready").exists()
    assert "is active" in out.getvalue()


def test_image_for_another_kernel_is_refused_at_once(root: Path) -> None:
    """Modules built for another kernel are reported, with the kernels the image carries,
    before anything is staged."""
    driver, _out = _driver(root, KERNEL_VERSION="6.12.0-other")
    with pytest.raises(
        StagerError,
        match=r"built for kernel 6\.12\.0-other \(it carries: 6\.1\.0-test-amd64\), the node runs",
    ):
        driver.init(forever=lambda: None)
    assert list((root / "run/nvidia/modstage/incoming").iterdir()) == []


def test_a_multi_kernel_image_without_the_running_kernel_is_refused_at_once(root: Path) -> None:
    """An image of several kernels (module directories under MODSTAGE_MODULES_ROOT, as
    build-image writes it) that lacks the node's running kernel is refused before anything
    is staged, naming the kernels it carries."""
    shutil.rmtree(root / f"opt/modstage/modules/{KERNEL}")
    _carry(root, NEXT)
    driver, _out = _driver(root)
    with pytest.raises(
        StagerError,
        match=rf"carries no modules for kernel {KERNEL} \(it carries: {NEXT}\): use an image",
    ):
        driver.init(forever=lambda: None)
    assert list((root / "run/nvidia/modstage/incoming").iterdir()) == []


def test_missing_firmware_is_one_error_and_no_drop(root: Path) -> None:
    """A firmware directory that is not there is refused before staging."""
    driver, _out = _driver(root, MODSTAGE_FIRMWARE_DIR="/opt/none")
    with pytest.raises(StagerError, match="/opt/none: firmware directory does not exist"):
        driver.init(forever=lambda: None)
    assert list((root / "run/nvidia/modstage/incoming").iterdir()) == []


def test_no_host_directory_times_out_with_a_reason(root: Path) -> None:
    """Without the host's pod directory, init waits MODSTAGE_HOST_WAIT seconds, then says why."""
    (root / "run/nvidia/modstage/incoming").rmdir()
    driver, _out = _driver(root, MODSTAGE_HOST_WAIT="3")
    with pytest.raises(StagerError, match="is modstage serve running"):
        driver.init(forever=lambda: None)


def test_peermem_verbs_report_what_the_host_loaded(root: Path) -> None:
    """probe/reload succeed when the host loaded nvidia-peermem, and say what to do if not."""
    driver, out = _driver(root)
    assert driver.probe_peermem() == 1
    assert driver.reload_peermem(forever=lambda: None) == 1
    assert "add it to the bundle" in out.getvalue()
    _load(root, "nvidia_peermem", "2.0")
    assert driver.probe_peermem() == 0
    assert driver.reload_peermem(forever=lambda: None) == 0


def test_loaded_version_reads_sysfs(root: Path) -> None:
    """None when not loaded, '' when loaded without a version, else the version."""
    assert loaded_version(root / "sys") is None
    (root / "sys/module/nvidia").mkdir()
    (root / "sys/module/nvidia/refcnt").write_text("0")
    assert loaded_version(root / "sys") == ""


def test_main_refuses_unknown_verbs_and_missing_version(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """A verb the operator does not use is a usage error; no DRIVER_VERSION is one line."""
    assert main(["load"]) == 2
    monkeypatch.delenv("DRIVER_VERSION", raising=False)
    assert main(["probe_nvidia_peermem"]) == 1
    assert capsys.readouterr().err.endswith(
        "error: DRIVER_VERSION: not set (the image must name its driver version)\n"
    )


NEXT = "6.12.0-next-amd64"


def _announce(
    root: Path, next_kernel: str | None, cover: str = "none", version: str | None = None
) -> None:
    """The host's ``_host.json`` as ``service.publish.announce`` writes it (``version``: the
    version a boot into ``next_kernel`` loads)."""
    status = root / "run/nvidia/modstage/status"
    status.mkdir(parents=True, exist_ok=True)
    doc = {
        "schema": 1,
        "running_kernel": KERNEL,
        "next_kernel": next_kernel,
        "installed": [KERNEL] + ([next_kernel] if next_kernel else []),
        "bundles": {"nvidia": {"next": cover}},
    }
    if version is not None:
        doc["bundles"] = {"nvidia": {"next": cover, "next_version": version}}
    (status / "_host.json").write_text(json.dumps(doc))


def _carry(root: Path, release: str) -> None:
    mods = root / f"opt/modstage/modules/{release}"
    mods.mkdir(parents=True)
    for name in ("nvidia", "nvidia-modeset", "nvidia-uvm"):
        (mods / f"{name}.ko").write_bytes(module_bytes(100 * len(name) + 1, name.encode()))


def test_a_multi_kernel_image_stages_for_the_next_kernel_once(root: Path) -> None:
    """The pod runs on KERNEL with its driver loaded; the host announces NEXT as the next
    boot's kernel with no nvidia for it: the pod stages the image's NEXT modules (the drop's
    manifest names NEXT, carries the digest), once; nothing while the host says ``ready``,
    nor while the next boot runs the running kernel."""
    _carry(root, NEXT)
    driver, out = _driver(root)
    incoming = root / "run/nvidia/modstage/incoming"
    assert driver.next_kernel() is None  # nothing announced (an older host)
    _announce(root, KERNEL)
    assert driver.next_kernel() is None
    _announce(root, NEXT, cover="ready")
    assert driver.next_kernel() is None and list(incoming.iterdir()) == []
    _announce(root, NEXT)
    name = driver.next_kernel()
    [drop] = list(incoming.iterdir())
    assert drop.name == name
    manifest = Manifest.from_toml((drop / MANIFEST_NAME).read_bytes())
    assert manifest.kernel == NEXT and (drop / DIGEST_NAME).read_text().strip() == "777"
    assert f"the next boot runs kernel {NEXT}: staged {name}" in out.getvalue()
    assert driver.next_kernel() is None and len(list(incoming.iterdir())) == 1


def test_the_pod_stages_its_own_version_over_an_older_one_carried_for_the_next_kernel(
    root: Path,
) -> None:
    """The host would load an older build for NEXT (``ready`` with another version): the pod
    stages its own; with its own version ready, nothing."""
    _carry(root, NEXT)
    driver, _out = _driver(root)
    incoming = root / "run/nvidia/modstage/incoming"
    _announce(root, NEXT, cover="ready", version="2.0")  # DRIVER_VERSION
    assert driver.next_kernel() is None and list(incoming.iterdir()) == []
    _announce(root, NEXT, cover="ready", version="535.0.1")
    name = driver.next_kernel()
    assert name is not None and [d.name for d in incoming.iterdir()] == [name]


def test_a_restarted_pod_stages_nothing_while_a_drop_for_the_next_kernel_waits(
    root: Path,
) -> None:
    """The host says ``waiting`` for NEXT (a drop for it, its predecessor's, is not judged
    yet): the pod stages nothing until the host's cover changes; ``refused``: it stages."""
    _carry(root, NEXT)
    driver, _out = _driver(root)
    incoming = root / "run/nvidia/modstage/incoming"
    _announce(root, NEXT, cover="waiting")
    assert driver.next_kernel() is None and list(incoming.iterdir()) == []
    _announce(root, NEXT, cover="refused")
    name = driver.next_kernel()
    assert name is not None and [d.name for d in incoming.iterdir()] == [name]


def test_a_kernel_the_image_lacks_and_a_refusal_are_said_once(root: Path) -> None:
    """The image carries only KERNEL: the pod says once that it has no modules for NEXT and
    stages nothing. For an image carrying NEXT whose drop the host refused, the pod says the
    host's reason once."""
    driver, out = _driver(root)
    _announce(root, NEXT)
    assert driver.next_kernel() is None and driver.next_kernel() is None
    said = out.getvalue()
    assert said.count(f"kernel {NEXT}, which this image carries no modules for") == 1
    assert f"(it carries: {KERNEL})" in said
    assert list((root / "run/nvidia/modstage/incoming").iterdir()) == []
    _carry(root, NEXT)
    name = driver.next_kernel()
    assert name is not None
    doc = {
        "bundle": "nvidia",
        "phase": "active",
        "updated": time.time(),
        "errors": [],
        "rejected": {name: "vermagic is for another kernel"},
    }
    (root / "run/nvidia/modstage/status/nvidia.json").write_text(json.dumps(doc))
    driver.next_kernel()
    driver.next_kernel()
    assert out.getvalue().count(f"the host refused {name} for kernel {NEXT}: vermagic") == 1


def test_the_sleeping_pod_stages_for_the_next_kernel_and_stops_on_sigterm(root: Path) -> None:
    """``sleep_until_term`` (in a process of its own, as the pod's): the host announces NEXT
    while it sleeps and the pod stages for it within its period; SIGTERM then stops it at
    once, saying the modules stay loaded."""
    import os
    import signal
    import subprocess
    import sys

    _carry(root, NEXT)
    script = (
        "import sys; from pathlib import Path; from stager.driver import Driver, Settings\n"
        "env = {'DRIVER_VERSION': '2.0', 'KERNEL_VERSION': sys.argv[2],"
        " 'MODSTAGE_NEXT_KERNEL_EVERY': '0.1'}\n"
        "s = Settings.from_environ(env, Path(sys.argv[1]))\n"
        "Driver(s, sys.stdout, mount=lambda argv: 0).sleep_until_term()\n"
    )
    repo = Path(__file__).resolve().parents[2]
    proc = subprocess.Popen(
        [sys.executable, "-c", script, str(root), KERNEL],
        stdout=subprocess.PIPE,
        text=True,
        cwd=repo,
        env={**os.environ, "PYTHONPATH": str(repo)},
    )
    incoming = root / "run/nvidia/modstage/incoming"
    try:
        time.sleep(0.3)
        _announce(root, NEXT)
        deadline = time.monotonic() + 20
        while not list(incoming.iterdir()):
            assert time.monotonic() < deadline, "the sleeping pod never staged for NEXT"
            time.sleep(0.05)
        proc.send_signal(signal.SIGTERM)
        out, _ = proc.communicate(timeout=20)
    finally:
        proc.kill()
    assert proc.returncode == 0, out
    assert f"the next boot runs kernel {NEXT}: staged" in out
    assert "stopping; the nvidia modules stay loaded" in out

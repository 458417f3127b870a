"""The operator-facing deployment files agree with the code and with the operator's contract."""

from __future__ import annotations

import os
import subprocess
from datetime import UTC, datetime, time, timedelta
from pathlib import Path
from typing import Any

import yaml

from service.config import Config
from service.layout import Layout
from service.window import Window
from tests.vm.operator.upgrade_controller import (
    Container,
    Pod,
    State,
    UpgradeController,
    restarts_while_waiting,
)

ROOT = Path(__file__).resolve().parents[1]
DEPLOY = ROOT / "deploy"
IMAGE = DEPLOY / "driver-container"


def _docs(name: str) -> list[dict[str, Any]]:
    return list(yaml.safe_load_all((DEPLOY / "kubernetes" / name).read_text()))


def test_containerfile_copies_files_that_exist_and_runs_nvidia_driver() -> None:
    """Every repository path the Containerfile copies exists; its command is nvidia-driver;
    firmware goes where the operator's /lib/firmware mount does not hide it."""
    text = (IMAGE / "Containerfile").read_text()
    for line in text.splitlines():
        if line.startswith("COPY ") and "--from=" not in line:
            for source in line.split()[1:-1]:
                assert (ROOT / source).exists(), source
    assert "COPY deploy/driver-container/nvidia-driver /usr/local/bin/nvidia-driver" in text
    assert 'CMD ["nvidia-driver", "init"]' in text
    firmware = [ln for ln in text.splitlines() if ln.startswith("COPY --from=firmware")]
    assert firmware and all("/lib/firmware" not in ln for ln in firmware)


def test_nvidia_driver_wrapper_runs_the_verbs(tmp_path: Path) -> None:
    """The image's nvidia-driver runs stager.driver: an unknown verb is a usage error (2)."""
    env = {"PATH": os.environ["PATH"], "PYTHONPATH": str(ROOT)}
    text = (IMAGE / "nvidia-driver").read_text().replace("/opt/modstage/lib", str(ROOT))
    wrapper = tmp_path / "nvidia-driver"
    wrapper.write_text(text)
    wrapper.chmod(0o755)
    done = subprocess.run([wrapper, "load"], env=env, capture_output=True, text=True, check=False)
    assert done.returncode == 2 and "init|reload_nvidia_peermem|probe_nvidia_peermem" in done.stderr
    env["DRIVER_VERSION"] = "1"
    env["MODSTAGE_DIR"] = str(tmp_path)
    done = subprocess.run(
        [wrapper, "probe_nvidia_peermem"], env=env, capture_output=True, text=True, check=False
    )
    assert done.returncode in (0, 1)  # depends on this machine's /sys, but it ran


def test_cluster_policy_sets_only_what_the_operator_allows() -> None:
    """The example sets the driver image, kernelModuleConfig, startup probe and upgrade policy,
    and its probe budget covers at least the default 21 minutes."""
    policy, params = _docs("driver-example.yaml")
    assert (policy["kind"], params["kind"]) == ("ClusterPolicy", "ConfigMap")
    driver = policy["spec"]["driver"]
    assert driver["kernelModuleConfig"]["name"] == params["metadata"]["name"]
    probe = driver["startupProbe"]
    assert probe["periodSeconds"] * probe["failureThreshold"] >= 120 * 10
    assert driver["upgradePolicy"]["maxParallelUpgrades"] == 1
    assert not {"volumes", "volumeMounts", "command", "args", "initContainers"} & driver.keys()
    assert all(name.endswith(".conf") for name in params["data"])


def test_example_config_publishes_under_run_nvidia_only() -> None:
    """The operator pod's paths in config.example.toml all lie under /run/nvidia, its only
    host mount, and the daemon's pod mounts the directory they share."""
    cfg = Config.load(DEPLOY / "config.example.toml")
    layout = Layout(Path("/"))
    pod_paths = [p for p in cfg.incoming_dirs if p != str(layout.incoming)]
    pod_paths += list(cfg.publish.status_dirs) + [p for _b, p in cfg.publish.digest_files]
    assert pod_paths and all(p.startswith("/run/nvidia/") for p in pod_paths)
    assert cfg.publish.digest_file("nvidia") == "/run/nvidia/nvidia-driver.state"
    (ds,) = [d for d in _docs("modstage-daemonset.yaml") if d["kind"] == "DaemonSet"]
    host = {v["hostPath"]["path"] for v in ds["spec"]["template"]["spec"]["volumes"]}
    for path in cfg.incoming_dirs[1:] + cfg.publish.status_dirs:
        assert any(path.startswith(h + "/") or path == h for h in host), path


REBOOT_ALLOWANCE = 900  # deploy/README.md: shutdown, a GPU server's POST, boot to Ready


def _kured_flags() -> dict[str, str]:
    kured = next(d for d in _docs("kured-daemonset.yaml") if d["kind"] == "DaemonSet")
    command = kured["spec"]["template"]["spec"]["containers"][0]["command"]
    return dict(a[2:].split("=", 1) for a in command if a.startswith("--") and "=" in a)


def _seconds(duration: str) -> int:
    units = {"s": 1, "m": 60, "h": 3600}
    return int(duration[:-1]) * units[duration[-1]]


def longest_closed(window: Window) -> int:
    """The longest stretch, in seconds, in which ``window`` is closed (a minute's grain)."""
    start = datetime(2026, 11, 30, tzinfo=UTC)  # a Monday
    longest = run = 0
    for minute in range(2 * 7 * 24 * 60):  # two weeks: a stretch may cross the week's end
        if window.contains(start + timedelta(minutes=minute)):
            run = 0
        else:
            run += 60
            longest = max(longest, run)
    return longest


def test_startup_probe_outlasts_the_longest_wait_for_a_reboot() -> None:
    """The driver container waits, unready, from its pod's start until the node has rebooted:
    at worst the longest closed stretch of kured's window, one kured period, kured's drain
    timeout and the reboot. The example's probe budget covers that in one attempt, so the
    upgrade controller never sees a restart; the operator's default probe is restarted more
    than 10 times in that wait and the controller marks the node upgrade-failed."""
    flags = _kured_flags()
    days = tuple(flags["reboot-days"].split(","))
    window = Window(
        days, time.fromisoformat(flags["start-time"]), time.fromisoformat(flags["end-time"])
    )
    closed = longest_closed(window) + 60  # the minute's grain
    assert closed == (3 * 24 + 21) * 3600  # Thursday 05:00 to Monday 02:00
    wait = closed + _seconds(flags["period"]) + _seconds(flags["drain-timeout"]) + REBOOT_ALLOWANCE
    policy, _ = _docs("driver-example.yaml")
    probe = policy["spec"]["driver"]["startupProbe"]
    budget = probe["initialDelaySeconds"] + probe["periodSeconds"] * probe["failureThreshold"]
    assert budget >= wait, (budget, wait)
    for settings, state in (
        ((probe["initialDelaySeconds"], probe["periodSeconds"], probe["failureThreshold"]), None),
        ((60, 10, 120), State.FAILED),  # the operator's default probe
    ):
        restarts = restarts_while_waiting(wait, *settings)
        c = UpgradeController("r1", State.POD_RESTART_REQUIRED)
        c.reconcile(0, Pod("r1", True, (Container("nvidia-driver-ctr", False, restarts),)), True)
        assert c.state is (state or State.POD_RESTART_REQUIRED), (settings, restarts)

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
from service.rebooting.window import Window
from tests.vm.operator.nvidiadriver import (
    DEPLOY_DRIVER,
    GPU_PRESENT,
    KERNEL,
    OS_ID,
    OS_VERSION,
    OWNER_LABEL,
    NVIDIADriver,
    assign_owners,
    daemonsets,
)
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


def _longest_wait() -> int:
    """The longest a driver container waits, unready, for its reboot: the longest closed
    stretch of kured's window, one kured period, kured's drain timeout and the reboot."""
    flags = _kured_flags()
    days = tuple(flags["reboot-days"].split(","))
    window = Window(
        days, time.fromisoformat(flags["start-time"]), time.fromisoformat(flags["end-time"])
    )
    closed = longest_closed(window) + 60  # the minute's grain
    assert closed == (3 * 24 + 21) * 3600  # Thursday 05:00 to Monday 02:00
    return closed + _seconds(flags["period"]) + _seconds(flags["drain-timeout"]) + REBOOT_ALLOWANCE


def _probes() -> dict[str, dict[str, int]]:
    """Every startup probe the manifests set: the ClusterPolicy's, each NVIDIADriver's."""
    policy, _ = _docs("driver-example.yaml")
    probes = {"ClusterPolicy": policy["spec"]["driver"]["startupProbe"]}
    for name, doc in _nvidiadrivers().items():
        probes[name] = doc["spec"]["startupProbe"]
    return probes


def test_startup_probe_outlasts_the_longest_wait_for_a_reboot() -> None:
    """The driver container waits, unready, from its pod's start until the node has rebooted:
    at worst the longest closed stretch of kured's window, one kured period, kured's drain
    timeout and the reboot. Every probe the manifests set (the ClusterPolicy's and each
    NVIDIADriver's) covers that in one attempt, so the upgrade controller never sees a
    restart; the operator's default probe is restarted more than 10 times in that wait and
    the controller marks the node upgrade-failed."""
    wait = _longest_wait()
    for name, probe in _probes().items():
        budget = probe["initialDelaySeconds"] + probe["periodSeconds"] * probe["failureThreshold"]
        assert budget >= wait, (name, budget, wait)
        for settings, state in (
            (
                (probe["initialDelaySeconds"], probe["periodSeconds"], probe["failureThreshold"]),
                None,
            ),
            ((60, 10, 120), State.FAILED),  # the operator's default probe
        ):
            restarts = restarts_while_waiting(wait, *settings)
            c = UpgradeController("r1", State.POD_RESTART_REQUIRED)
            c.reconcile(
                0, Pod("r1", True, (Container("nvidia-driver-ctr", False, restarts),)), True
            )
            assert c.state is (state or State.POD_RESTART_REQUIRED), (name, settings, restarts)


# The NVIDIADriver CRD's schema as gpu-operator v26.7.0 publishes it
# (deployments/gpu-operator/crds/nvidia.com_nvidiadrivers.yaml): cluster-scoped,
# nvidia.com/v1alpha1; what the manifests may set and must set.
CRD_SPEC = {
    "annotations", "args", "certConfig", "default", "driverType", "env", "gdrcopy", "gds",
    "hostNetwork", "image", "imagePullPolicy", "imagePullSecrets", "kernelModuleConfig",
    "kernelModuleType", "labels", "licensingConfig", "livenessProbe", "manager",
    "nodeAffinity", "nodeSelector", "podSecurityContext", "priorityClassName", "rdma",
    "readinessProbe", "repoConfig", "repository", "resources", "secretEnv", "startupProbe",
    "tolerations", "upgradePolicy", "useOpenKernelModules", "usePrecompiled", "version",
    "virtualTopologyConfig",
}  # fmt: skip
CRD_REQUIRED = {"default", "driverType", "image"}
CRD_ENUMS = {
    "driverType": {"gpu", "vgpu", "vgpu-host-manager"},
    "kernelModuleType": {"auto", "open", "proprietary"},
}
CRD_PROBE = {"initialDelaySeconds", "periodSeconds", "timeoutSeconds", "successThreshold",
             "failureThreshold"}  # fmt: skip
CRD_UPGRADE = {"autoUpgrade", "drain", "maxParallelUpgrades", "maxUnavailable", "podDeletion",
               "waitForCompletion"}  # fmt: skip
CRD_DRAIN = {"deleteEmptyDir", "enable", "force", "podSelector", "timeoutSeconds"}
CRD_POD_DELETION = {"deleteEmptyDir", "force", "timeoutSeconds"}
CRD_MANAGER = {"env", "image", "imagePullPolicy", "imagePullSecrets", "repository", "version"}


def _nvidiadrivers() -> dict[str, dict[str, Any]]:
    """The NVIDIADriver manifests, one per pool (deploy/kubernetes/nvidiadriver-*.yaml)."""
    found = {}
    for path in sorted((DEPLOY / "kubernetes").glob("nvidiadriver-*.yaml")):
        (doc,) = _docs(path.name)
        found[doc["metadata"]["name"]] = doc
    return found


def test_nvidiadrivers_keep_to_the_operators_crd() -> None:
    """Each NVIDIADriver manifest is one object the operator's CRD accepts: its kind and
    version, no namespace (cluster-scoped), the required keys, known keys and enum values
    only, no selector on a default object or on the operator's owner label."""
    drivers = _nvidiadrivers()
    assert len(drivers) >= 2, "one NVIDIADriver per pool: at least two pools shown"
    for name, doc in drivers.items():
        assert (doc["apiVersion"], doc["kind"]) == ("nvidia.com/v1alpha1", "NVIDIADriver")
        assert "namespace" not in doc["metadata"], name
        spec = doc["spec"]
        assert spec.keys() >= CRD_REQUIRED and spec.keys() <= CRD_SPEC, (name, spec.keys())
        for key, allowed in CRD_ENUMS.items():
            assert spec.get(key, next(iter(allowed))) in allowed, (name, key)
        assert not (spec["default"] and spec.get("nodeSelector")), name
        assert OWNER_LABEL not in spec.get("nodeSelector", {}), name
        assert spec["startupProbe"].keys() <= CRD_PROBE, name
        policy = spec["upgradePolicy"]
        assert policy.keys() <= CRD_UPGRADE, name
        assert (
            policy["drain"].keys() <= CRD_DRAIN and policy["podDeletion"].keys() <= CRD_POD_DELETION
        )
        assert spec["manager"].keys() <= CRD_MANAGER, name


def test_nvidiadrivers_set_only_what_the_operator_allows_and_own_disjoint_pools() -> None:
    """As the ClusterPolicy: image, kernelModuleConfig (the example's ConfigMap), probe and
    upgrade policy (one node at a time), never the command or arguments; each pool's node
    is owned by its own object (no two selectors match one node: ConflictingNodeSelector);
    a precompiled pool's image tag carries the node's kernel."""
    _policy, params = _docs("driver-example.yaml")
    drivers = _nvidiadrivers()
    objects = []
    for name, doc in drivers.items():
        spec = doc["spec"]
        assert spec["kernelModuleConfig"]["name"] == params["metadata"]["name"], name
        assert spec["upgradePolicy"]["autoUpgrade"] is True, name
        assert spec["upgradePolicy"]["maxParallelUpgrades"] == 1, name
        assert not {"args", "command", "volumes", "initContainers"} & spec.keys(), name
        objects.append(
            NVIDIADriver(
                name,
                f"uid-{name}",
                spec["repository"],
                spec["image"],
                spec["version"],
                node_selector=spec.get("nodeSelector", {}),
                default=spec["default"],
                use_precompiled=spec.get("usePrecompiled", False),
            )
        )
    nodes = {
        name: {
            GPU_PRESENT: "true",
            DEPLOY_DRIVER: "true",
            OS_ID: "debian",
            OS_VERSION: "13",
            KERNEL: "6.12.57-amd64",
            **doc["spec"].get("nodeSelector", {}),
        }
        for name, doc in drivers.items()
    }
    owners = assign_owners(objects, nodes)  # raises on two selectors matching one node
    assert owners == {name: name for name in drivers}
    for node, labels in nodes.items():
        labels[OWNER_LABEL] = node
    for ds in daemonsets(objects, nodes).values():
        assert ds.name.startswith("nvidia-gpu-driver-debian13-")
        tag = ds.image.split(":", 1)[1]
        assert (
            tag.endswith("-6.12.57-amd64-debian13") if ds.precompiled else tag.endswith("-debian13")
        )
    assert any(d.use_precompiled for d in objects) and not all(d.use_precompiled for d in objects)

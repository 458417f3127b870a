"""The pre-stage DaemonSet (deploy/kubernetes/nvidia-prestage.yaml) agrees with the host's
labels, the precompiled pool it serves, the driver image and ``nvidia-driver prestage``."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path
from typing import Any

import yaml

from service.bundles.state import State
from service.config import Config
from service.publish.labels import render
from stager.driver import Settings
from tests.test_deploy import GPU_TAINTS, tolerates
from tests.vm.operator.nvidiadriver import (
    GPU_PRESENT,
    KERNEL,
    OS_ID,
    OS_VERSION,
    NVIDIADriver,
    Pool,
    config_digest,
    image_path,
    os_tag,
)

ROOT = Path(__file__).resolve().parents[1]
DEPLOY = ROOT / "deploy"
RUNNING = "6.12.57-amd64"


def _docs(name: str) -> list[dict[str, Any]]:
    return list(yaml.safe_load_all((DEPLOY / "kubernetes" / name).read_text()))


def _prestage() -> tuple[dict[str, Any], dict[str, Any]]:
    """The DaemonSet and its pod spec."""
    (ds,) = _docs("nvidia-prestage.yaml")
    assert (ds["apiVersion"], ds["kind"]) == ("apps/v1", "DaemonSet")
    return ds, ds["spec"]["template"]["spec"]


def _expressions() -> list[dict[str, Any]]:
    _ds, spec = _prestage()
    terms = spec["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
    (term,) = terms["nodeSelectorTerms"]
    assert term.keys() == {"matchExpressions"}
    found: list[dict[str, Any]] = term["matchExpressions"]
    return found


def _kernel() -> str:
    """The next kernel the DaemonSet is for (its ``kernel.next`` value)."""
    prefix = Config().node_labels.prefix
    (expr,) = [e for e in _expressions() if e["key"] == f"{prefix}/kernel.next"]
    assert expr["operator"] == "In"
    (kernel,) = expr["values"]
    assert isinstance(kernel, str)
    return kernel


def selects(expressions: list[dict[str, Any]], labels: dict[str, str]) -> bool:
    """Kubernetes' node selector requirements (In, NotIn, Exists, DoesNotExist), all of them."""
    for e in expressions:
        value, op = labels.get(e["key"]), e["operator"]
        if op == "In" and value not in e["values"]:
            return False
        if op == "NotIn" and value in e["values"]:
            return False
        assert op in ("In", "NotIn", "Exists", "DoesNotExist"), op
        if (op == "Exists" and value is None) or (op == "DoesNotExist" and value is not None):
            return False
    return True


def _pool_b() -> dict[str, Any]:
    (doc,) = _docs("nvidiadriver-pool-b.yaml")
    assert doc["spec"]["usePrecompiled"] is True
    return doc


def _node(next_kernel: str | None, running: str, **extra: str) -> dict[str, str]:
    """A pool B node's labels: NFD's, the operator's, and modstage's as the host writes them."""
    labels = {
        GPU_PRESENT: "true",
        OS_ID: "debian",
        OS_VERSION: "13",
        KERNEL: running,
        **_pool_b()["spec"]["nodeSelector"],
        **extra,
    }
    text = render(State(), Config().node_labels.prefix, next_kernel, running).decode()
    for line in text.splitlines():
        if not line.startswith("#"):
            key, _, value = line.partition("=")
            labels[key] = value
    return labels


def test_prestage_runs_on_pool_nodes_whose_next_kernel_is_its_own() -> None:
    """Selected: a pool B node whose host announces K (the host's own ``kernel.next`` label)
    while NFD says it runs another kernel. Not selected: the same node once it runs K (the
    DaemonSet controller then removes the pod), a node with no kernel update or another
    one, a node of another pool, a node without the label. GPU taints are tolerated."""
    kernel, expressions = _kernel(), _expressions()
    assert selects(expressions, _node(kernel, RUNNING))
    assert not selects(expressions, _node(kernel, kernel))
    assert not selects(expressions, _node(RUNNING, RUNNING))
    assert not selects(expressions, _node("6.12.69-amd64", RUNNING))
    assert not selects(expressions, _node(kernel, RUNNING, **{"example.com/gpu-pool": "a"}))
    assert not selects(expressions, _node(None, RUNNING))
    _ds, spec = _prestage()
    assert all(tolerates(spec["tolerations"], taint) for taint in GPU_TAINTS)


def test_prestage_runs_the_pools_image_for_its_kernel_in_prestage_mode() -> None:
    """The image is the one the operator gives pool B's pod on K (the stand-in's
    ``image_path``), the command ``nvidia-driver prestage``, and ``DRIVER_CONFIG_DIGEST`` the
    operator's digest of pool B at K as far as the stand-in models it (not the running
    kernel's: a precompiled digest covers the kernel)."""
    kernel = _kernel()
    spec = _pool_b()["spec"]
    driver = NVIDIADriver(
        "gpu-pool-b",
        "uid",
        spec["repository"],
        spec["image"],
        spec["version"],
        node_selector=spec["nodeSelector"],
        use_precompiled=True,
        kernel_module_config=spec["kernelModuleConfig"]["name"],
    )
    pool = Pool(os_tag("debian", "13"), kernel, {})
    _ds, pod = _prestage()
    (container,) = pod["containers"]
    assert container["image"] == image_path(driver, pool)
    assert container["command"] == ["nvidia-driver", "prestage"]
    env = {e["name"]: e["value"] for e in container["env"]}
    assert env["DRIVER_CONFIG_DIGEST"] == config_digest(driver, pool)
    assert env["DRIVER_CONFIG_DIGEST"] != config_digest(driver, Pool(pool.os_tag, RUNNING, {}))


def test_prestage_mounts_only_the_hosts_pod_directory_and_the_pools_parameters() -> None:
    """The host's /run/nvidia/modstage at the image's MODSTAGE_DIR (where config.example.toml
    takes drops and publishes status), the pool's kernelModuleConfig ConfigMap at /drivers in
    its namespace; nothing of /run/nvidia or /sys, not privileged, no host PID."""
    ds, spec = _prestage()
    (container,) = spec["containers"]
    volumes = {v["name"]: v for v in spec["volumes"]}
    mounts = {m["name"]: m["mountPath"] for m in container["volumeMounts"]}
    hostpaths = {n: v["hostPath"]["path"] for n, v in volumes.items() if "hostPath" in v}
    assert list(hostpaths.values()) == ["/run/nvidia/modstage"]
    assert all(mounts[n] == p for n, p in hostpaths.items())
    settings = Settings.from_environ({"DRIVER_VERSION": "1", "KERNEL_VERSION": _kernel()})
    image = (DEPLOY / "driver-container/Containerfile").read_text()
    assert (
        "MODSTAGE_DIR=/run/nvidia/modstage" in image and "KERNEL_VERSION=${KERNEL_VERSION}" in image
    )
    assert str(settings.params_dir) == "/drivers"
    cfg = Config.load(DEPLOY / "config.example.toml")
    for path in [*cfg.incoming_dirs[1:], *cfg.publish.status_dirs]:
        assert path.startswith("/run/nvidia/modstage/"), path
    _policy, params = _docs("driver-example.yaml")
    (config_map,) = [v["configMap"]["name"] for v in volumes.values() if "configMap" in v]
    assert (
        config_map == params["metadata"]["name"] == _pool_b()["spec"]["kernelModuleConfig"]["name"]
    )
    assert ds["metadata"]["namespace"] == params["metadata"]["namespace"]
    (cm_mount,) = [m for m in container["volumeMounts"] if volumes[m["name"]].get("configMap")]
    assert cm_mount["mountPath"] == "/drivers" and cm_mount["readOnly"] is True
    assert container["securityContext"]["privileged"] is False and not spec.get("hostPID")


def test_the_images_command_runs_prestage_and_requires_the_digest(tmp_path: Path) -> None:
    """The image's nvidia-driver knows ``prestage``; without DRIVER_CONFIG_DIGEST it exits 1
    naming it, so a DaemonSet that forgot it crash-loops visibly instead of staging a drop
    the next pod's init container would unload."""
    text = (DEPLOY / "driver-container/nvidia-driver").read_text()
    wrapper = tmp_path / "nvidia-driver"
    wrapper.write_text(text.replace("/opt/modstage/lib", str(ROOT)))
    wrapper.chmod(0o755)
    env = {"PATH": os.environ["PATH"], "DRIVER_VERSION": "1", "KERNEL_VERSION": _kernel()}
    done = subprocess.run([wrapper, "prestage"], env=env, capture_output=True, text=True)
    assert done.returncode == 1, done
    assert "nvidia-driver prestage: error: DRIVER_CONFIG_DIGEST: not set" in done.stderr

"""The deployment files parse and agree with the code: layout, subcommands, config, flags."""

from __future__ import annotations

import argparse
import shlex
from pathlib import Path
from typing import Any

import pytest
import yaml

from service.cli import build_parser
from service.config import Config
from service.layout import Layout

DEPLOY = Path(__file__).resolve().parents[1] / "deploy"
UNITS = sorted((DEPLOY / "systemd").glob("*.service"))


def manifests() -> dict[str, list[dict[str, Any]]]:
    """Every Kubernetes document, by file name, parsed with a YAML parser."""
    return {
        p.name: list(yaml.safe_load_all(p.read_text()))
        for p in sorted((DEPLOY / "kubernetes").glob("*.yaml"))
    }


def daemonset(file: str) -> dict[str, Any]:
    """The one DaemonSet in ``file``."""
    (ds,) = [d for d in manifests()[file] if d["kind"] == "DaemonSet"]
    return ds


def unit(path: Path) -> dict[str, list[str]]:
    """A systemd unit's keys (repeatable, as systemd allows) with their values."""
    keys: dict[str, list[str]] = {}
    for line in path.read_text().splitlines():
        if "=" in line and not line.startswith(("#", "[")):
            key, _, value = line.partition("=")
            keys.setdefault(key.strip(), []).append(value.strip())
    return keys


def subcommands() -> dict[str, argparse.ArgumentParser]:
    """``modstage``'s subcommands and their parsers."""
    (sub,) = [a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction)]
    return dict(sub.choices)


def test_every_yaml_parses_into_kubernetes_objects() -> None:
    """Each document has apiVersion, kind and a name; there is at least the daemon's DaemonSet."""
    docs = [d for ds in manifests().values() for d in ds]
    assert docs and all({"apiVersion", "kind", "metadata"} <= d.keys() for d in docs)
    assert all(d["metadata"].get("name") for d in docs)


def test_daemonset_mounts_exactly_the_layout_paths_at_the_same_place() -> None:
    """The daemon's pod sees /var/lib/modstage, /etc/modstage, /sys, /run/modstage, nothing else."""
    layout = Layout(Path("/"))
    spec = daemonset("modstage-daemonset.yaml")["spec"]["template"]["spec"]
    host = {v["name"]: v["hostPath"]["path"] for v in spec["volumes"]}
    # plus the operator's pod directory (config.example.toml: incoming_dirs, publish)
    operator = {"/run/nvidia/modstage"}
    assert (
        set(host.values())
        == {str(p) for p in (layout.var, layout.etc, layout.sys, layout.run)} | operator
    )
    (container,) = spec["containers"]
    mounts = {m["name"]: m for m in container["volumeMounts"]}
    assert {n: m["mountPath"] for n, m in mounts.items()} == host
    assert mounts["config"].get("readOnly") is True
    assert container["securityContext"]["privileged"] is True and not spec.get("hostPID")
    assert subcommands()[container["command"][1]].get_default("command") == "service.cmd.serve"


def test_kured_sentinel_is_the_configured_one_and_the_daemon_can_write_it() -> None:
    """kured watches the sentinel config.example.toml names, which lies under a mounted path."""
    sentinel = Config.load(DEPLOY / "config.example.toml").reboot.sentinel
    assert sentinel is not None
    args = daemonset("kured-daemonset.yaml")["spec"]["template"]["spec"]["containers"][0]["command"]
    assert f"--reboot-sentinel={sentinel}" in args
    assert sentinel.is_relative_to(Layout(Path("/")).run)


@pytest.mark.parametrize("path", UNITS, ids=lambda p: p.name)
def test_units_run_real_subcommands(path: Path) -> None:
    """Each unit's ExecStart is /usr/bin/modstage with a subcommand the parser accepts."""
    argv = shlex.split(unit(path)["ExecStart"][0])
    assert argv[0] == "/usr/bin/modstage"
    build_parser().parse_args(argv[1:])
    assert argv[1] in subcommands()


def test_boot_unit_is_an_early_oneshot_before_the_runtimes() -> None:
    """The boot unit is a oneshot without default deps, before kubelet and every runtime."""
    keys = unit(DEPLOY / "systemd/modstage-boot.service")
    assert keys["Type"] == ["oneshot"] and keys["DefaultDependencies"] == ["no"]
    before = " ".join(keys["Before"]).split()
    assert {"kubelet.service", "containerd.service", "crio.service"} <= set(before)
    assert "local-fs.target" in keys["After"][0].split()
    assert "Requires" not in keys, "a failed load must never keep the node from booting"


def test_daemon_unit_follows_the_boot_unit_with_a_watchdog() -> None:
    """The daemon is Type=notify with a watchdog, restarted on failure, after the boot unit."""
    keys = unit(DEPLOY / "systemd/modstage.service")
    assert keys["Type"] == ["notify"] and keys["Restart"] == ["on-failure"]
    assert "WatchdogSec" in keys and "modstage-boot.service" in keys["After"][0].split()

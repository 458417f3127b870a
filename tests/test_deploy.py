"""The deployment files parse and agree with the code: layout, subcommands, config, flags."""

from __future__ import annotations

import argparse
import shlex
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from service.config import Config
from service.layout import Layout
from service.parser import build_parser

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
    assert subcommands()[container["command"][1]].get_default("command") == "serve"  # the daemon


def kured() -> tuple[dict[str, Any], dict[str, str]]:
    """kured's pod spec and its flags (``--name=value``) as kured parses them."""
    spec = daemonset("kured-daemonset.yaml")["spec"]["template"]["spec"]
    (container,) = spec["containers"]
    assert container["command"][0] == "/usr/bin/kured"
    flags = dict(a.removeprefix("--").partition("=")[::2] for a in container["command"][1:])
    return spec, flags


def tolerates(tolerations: list[dict[str, str]], taint: dict[str, str]) -> bool:
    """Kubernetes' matching of one taint against a pod's tolerations."""
    for t in tolerations:
        if t.get("effect") and t["effect"] != taint["effect"]:
            continue
        if t.get("operator", "Equal") == "Exists":
            if not t.get("key") or t["key"] == taint["key"]:
                return True
        elif t.get("key") == taint["key"] and t.get("value", "") == taint.get("value", ""):
            return True
    return False


GPU_TAINTS = [
    {"key": "nvidia.com/gpu", "value": v, "effect": e}
    for v in ("", "present", "true")
    for e in ("NoSchedule", "PreferNoSchedule", "NoExecute")
]


def test_kured_runs_on_gpu_and_control_plane_nodes() -> None:
    """nvidia.com/gpu taints (any value, any effect) and control-plane ones are tolerated."""
    spec, _ = kured()
    for taint in [
        *GPU_TAINTS,
        {"key": "node-role.kubernetes.io/control-plane", "effect": "NoSchedule"},
    ]:
        assert tolerates(spec["tolerations"], taint), taint
    assert not tolerates(spec["tolerations"], {"key": "example.com/x", "effect": "NoSchedule"})


def test_the_documented_broad_toleration_tolerates_any_taint() -> None:
    """The commented alternative in the manifest is a valid toleration that matches anything."""
    text = (DEPLOY / "kubernetes/kured-daemonset.yaml").read_text()
    (line,) = [ln for ln in text.splitlines() if ln.strip() == "# - operator: Exists"]
    broad = yaml.safe_load(line.replace("#", "", 1).strip())
    assert tolerates(broad, {"key": "example.com/site", "value": "x", "effect": "NoExecute"})


def test_kured_sentinel_file_resolves_to_the_host_file_modstage_and_apt_write() -> None:
    """The path kured stats in its container is, through its hostPath mount, the host file
    the kured backend writes by default (and unattended-upgrades writes)."""
    from service.config import RebootConfig
    from service.rebooting.request import KuredSentinel, rebooter

    spec, flags = kured()
    stat = Path(flags["reboot-sentinel"])
    (container,) = spec["containers"]
    volumes = {v["name"]: v for v in spec["volumes"]}
    mounts = [m for m in container["volumeMounts"] if stat.is_relative_to(m["mountPath"])]
    assert mounts, f"{stat} is not on any volume: kured would never see it"
    mount = max(mounts, key=lambda m: len(m["mountPath"]))
    host = Path(volumes[mount["name"]]["hostPath"]["path"]) / stat.relative_to(mount["mountPath"])
    backend = rebooter(RebootConfig(backend="kured"), Layout(Path("/")))
    assert isinstance(backend, KuredSentinel)
    assert host == backend.path == Layout(Path("/")).reboot_sentinel


def test_example_config_lets_the_daemon_choose_the_moment() -> None:
    """With kured, the example config's backend is "kured": the sentinel command then says
    "required" once the daemon recorded its request (after min_delay, inside its window)."""
    assert Config.load(DEPLOY / "config.example.toml").reboot.backend == "kured"


def sentinel_command() -> list[str]:
    """The sentinel command, split as kured splits it (google/shlex: POSIX words)."""
    _, flags = kured()
    return shlex.split(flags["reboot-sentinel-command"])


def test_kured_sentinel_command_runs_modstage_in_the_host_namespace() -> None:
    """kured may nsenter (hostPID, privileged); the command's programs are the host's."""
    spec, _ = kured()
    assert spec["hostPID"] is True and spec["containers"][0]["securityContext"]["privileged"]
    argv = sentinel_command()
    assert Path(argv[0]).is_absolute() and Path(argv[0]).exists(), argv[0]
    installed = {shlex.split(unit(u)["ExecStart"][0])[0] for u in UNITS}
    script = shlex.split(argv[-1].replace(";", " ; "))
    (modstage,) = installed
    # the paths the command tries: the package's (deploy/debian/rules rewrites the units'
    # /usr/local/bin/modstage to /usr/bin/modstage) and deploy/install.sh's
    tried = script[script.index("in") + 1 : script.index(";")]
    rules = (DEPLOY / "debian/rules").read_text()
    assert f"s|{modstage}|/usr/bin/modstage|" in rules
    assert tried == ["/usr/bin/modstage", modstage], tried
    call = script[script.index("exec") + 1 :][:3]
    assert call[0] == "$m", "the command must run the modstage it found"
    assert build_parser().parse_args(call[1:]).reboot_required


REPO = DEPLOY.parent
NEEDS_REBOOT = "*** System restart required ***\n"


def _pending_state(kernel: str) -> str:
    from service.bundles.phase import Phase
    from service.bundles.state import BundleState, Generation, State
    from service.bundles.statefile import encode

    gen = Generation("b" * 64, "2.0", kernel, added=1.0)
    bundle = BundleState().with_generation(gen).move(Phase.PENDING, pending=gen.id)
    return encode(State({"nvidia": bundle})).decode()


SENTINEL_CASES = [
    # (modstage installed, state.json, /var/run/reboot-required, exit code kured sees)
    ("no modstage, nothing", False, None, False, 1),
    ("no modstage, apt wants a reboot", False, None, True, 0),
    ("modstage, nothing waits", True, None, False, 1),
    ("modstage, a generation waits", True, "pending", False, 0),
    ("modstage, apt wants a reboot", True, None, True, 0),
    ("modstage, corrupt state", True, "{corrupt", False, 3),
]


@pytest.mark.parametrize("where", ["/usr/local/bin", "/usr/bin"])
@pytest.mark.parametrize(
    ("case", "installed", "state", "apt", "code"),
    SENTINEL_CASES,
    ids=[c[0] for c in SENTINEL_CASES],
)
def test_kured_sentinel_command_exit_codes(
    tmp_path: Path,
    case: str,
    installed: bool,
    state: str | None,
    apt: bool,
    code: int,
    where: str,
) -> None:
    """Run as kured runs it (nsenter into a mount namespace standing in for the host's),
    with modstage where deploy/install.sh links it or where the Debian package installs it:
    0 reboot, 1 silent no, 3 a warning with the reason; the host's files are never written."""
    from tests.mountns import Overlay, run

    bin_, lib, run_ = tmp_path / "bin", tmp_path / "lib", tmp_path / "run"
    for d in (bin_, lib / "modstage", run_):
        d.mkdir(parents=True)
    if installed:
        shim = bin_ / "modstage"  # where deploy/install.sh links it, or the package's
        shim.write_text(f'#!/bin/sh\nPYTHONPATH={REPO} exec {sys.executable} -m service.cli "$@"\n')
        shim.chmod(0o755)
    if state is not None:
        kernel = Path("/proc/sys/kernel/osrelease").read_text().strip()
        text = _pending_state(kernel) if state == "pending" else state
        (lib / "modstage/state.json").write_text(text)
    if apt:
        (run_ / "reboot-required").write_text(NEEDS_REBOOT)
    overlays = [
        Overlay(where, bin_),
        Overlay("/var/lib", lib, tmp_path / "w-lib"),
        Overlay("/run", run_, tmp_path / "w-run"),
        Overlay("/etc", None, tmp_path / "w-etc"),
    ]
    done = run(sentinel_command(), overlays, nsenter=True)
    assert done.returncode == code, (case, done.stdout, done.stderr)
    if code == 3:
        assert "state.json" in done.stderr and "Traceback" not in done.stderr
    assert [o.written() for o in overlays] == [[], [], [], []]


@pytest.mark.parametrize("path", UNITS, ids=lambda p: p.name)
def test_units_run_real_subcommands(path: Path) -> None:
    """Each unit's ExecStart is the installed modstage with a subcommand the parser accepts."""
    argv = shlex.split(unit(path)["ExecStart"][0])
    assert argv[0] == "/usr/local/bin/modstage"  # deploy/install.sh links its venv there
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

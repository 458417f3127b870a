"""modstage's units under systemd as PID 1, installed by deploy/install.sh, on a real kernel.

One node, two boots. The install tree is built on the host from a copy of the checkout
(tests/test_install.py installs a wheel) with the admin's config and vendor certificate already in place,
and laid over the guest's root at every boot, as a host image carries it. Boot 1: the daemon
(sandboxed, no CAP_SYS_MODULE) reaches READY, takes in a drop staged with the installed
``modstage stage`` and reboots the node through the systemd backend. Boot 2: the boot unit
loads the pending generation before sysinit.target and before the containerd and kubelet
stand-ins start; the daemon reconciles, pets the watchdog, files errors at err priority, is
restarted after SIGKILL and stops cleanly.
"""

from __future__ import annotations

import shutil
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from service.bundles.phase import Phase
from service.publish.labels import FEATURES_DIR
from tests.installer import build_wheel, checkout, install, install_in_debian13, wheelhouse
from tests.kmod import SigningKey, make_key
from tests.vm.harness import Vm, VmFactory, kmod
from tests.vm.harness.kernel import Kernel
from tests.vm.harness.systemd import (
    SAW,
    events,
    journal,
    poll,
    require_systemd,
    show,
    systemd_args,
)
from tests.vm.node import live_modules, state

pytestmark = [pytest.mark.vm, pytest.mark.kernels("6.1", "6.12")]
CONFIG = """\
allowed_bundles = ["test"]
hotplug_policy = "online_movable"
[reboot]
backend = "systemd"
min_delay = 0
"""
CAP_SYS_MODULE = 16
DAEMON, BOOT = "modstage.service", "modstage-boot.service"
METRICS = "/var/lib/prometheus/node-exporter/modstage.prom"


@pytest.fixture(scope="module")
def key(tmp_path_factory: pytest.TempPathFactory) -> SigningKey:
    """The vendor's signing key."""
    return make_key(tmp_path_factory.mktemp("systemd-key"), "rsa4096", cn="systemd vendor")


@pytest.fixture(scope="module")
def tree(
    tmp_path_factory: pytest.TempPathFactory, key: SigningKey, kernel: Kernel
) -> Iterator[Path]:
    """deploy/install.sh --root TREE over an admin's config and trusted certificate: on 6.1
    on the host (Debian 12) from a copy of the checkout (the default source); on 6.12 inside
    a Debian 13 root from a wheel, so the venv is built on the node's Python 3.13, and the
    tree then put in the 6.12 node's own root (its /tmp), where the guest sees it."""
    work = tmp_path_factory.mktemp(f"systemd-install-{kernel.series}")
    tree = work / "tree"
    (tree / "etc/modstage/trusted.d").mkdir(parents=True)
    (tree / "etc/modstage/config.toml").write_text(CONFIG)
    (tree / "etc/modstage/trusted.d/vendor.pem").write_bytes(key.cert_pem.read_bytes())
    (tree / FEATURES_DIR.lstrip("/")).mkdir(parents=True)  # as nfd-worker's hostPath has it
    if kernel.own_root:
        done = install_in_debian13(tree, build_wheel(work))
    else:
        source = checkout(work)
        done = install(tree, "--from", source, "--wheels", wheelhouse(source))
    assert done.returncode == 0, done.stdout + done.stderr
    assert (tree / "etc/modstage/config.toml").read_text() == CONFIG
    if not kernel.own_root:
        yield tree
        return
    placed = Path(tempfile.mkdtemp(prefix="modstage-systemd-tree-", dir=kernel.root / "tmp"))
    try:
        shutil.copytree(tree, placed / "tree", symlinks=True)
        yield placed / "tree"
    finally:
        shutil.rmtree(placed, ignore_errors=True)


@pytest.fixture(scope="module")
def node(boot_vm: VmFactory, tree: Path, kernel: Kernel) -> Iterator[Vm]:
    """The node, booted with systemd as PID 1 over the install tree (its path as the guest
    sees it: the node's root is the host's / on 6.1, the Debian 13 root on 6.12)."""
    guest_tree = Path("/") / tree.relative_to(kernel.root) if kernel.own_root else tree
    vm = boot_vm("systemd", kernel_args=systemd_args(guest_tree))
    require_systemd(vm)
    yield vm
    vm.close()


def started(vm: Vm, unit: str) -> int:
    """When systemd began starting `unit` (monotonic microseconds; 0 if it never did)."""
    return int(show(vm, unit, "InactiveExitTimestampMonotonic")["InactiveExitTimestampMonotonic"])


def active_since(vm: Vm, unit: str) -> int:
    """When `unit` became active (monotonic microseconds; 0 if it never did)."""
    return int(show(vm, unit, "ActiveEnterTimestampMonotonic")["ActiveEnterTimestampMonotonic"])


def wait_for_reboot(vm: Vm, timeout: float) -> None:
    """Wait for the guest to reboot itself (qemu ends); on a timeout, fail with the daemon's
    journal."""
    deadline = time.monotonic() + timeout
    while vm.running and time.monotonic() < deadline:
        time.sleep(2)
    if vm.running:
        log = vm.run("journalctl -b --no-pager -u modstage.service | tail -40").stdout
        vm.kill()
        pytest.fail(f"the node did not reboot in {timeout:g} s; the daemon's journal:\n{log}")
    assert vm.wait_exit(10) == 0


def test_first_boot_installed_units_come_up_sandboxed(node: Vm) -> None:
    """Without state the boot unit is skipped by its condition; the daemon is READY (Type=
    notify) with its status text, and runs without CAP_SYS_MODULE; the installed
    ``modstage`` on the PATH works."""
    boot = show(node, BOOT, "ActiveState", "ConditionResult", "UnitFileState")
    assert boot == {"ActiveState": "inactive", "ConditionResult": "no", "UnitFileState": "enabled"}
    daemon = show(node, DAEMON, "ActiveState", "SubState", "StatusText", "MainPID", "NRestarts")
    assert (daemon["ActiveState"], daemon["SubState"], daemon["NRestarts"]) == (
        "active",
        "running",
        "0",
    ), daemon
    assert daemon["StatusText"].startswith(("watching", "idle")), daemon
    caps = node.read(f"/proc/{daemon['MainPID']}/status")
    bounding = int(
        next(line for line in caps.splitlines() if line.startswith("CapBnd:")).split()[1], 16
    )
    assert not bounding & (1 << CAP_SYS_MODULE), hex(bounding)
    assert node.run("command -v modstage").stdout.strip() == "/usr/local/bin/modstage"
    assert node.run("modstage --help").check().stdout.startswith("usage: modstage")
    ready = [e for e in events(journal(node, DAEMON)) if e["event"] == "daemon.ready"]
    assert ready and ready[0]["backend"] == "systemd" and ready[0]["PRIORITY"] == 6


def test_daemon_reboots_into_a_drop_the_boot_unit_loads_before_the_runtimes(
    node: Vm, kernel: Kernel, test_modules: dict[str, Path], key: SigningKey, tmp_path: Path
) -> None:
    """A drop staged on the node is taken in and the daemon reboots it through systemd; at
    the next boot the sandboxed boot unit loads the generation (parameters, firmware view,
    memory policy written to sysfs), finishing before sysinit.target and before the
    container runtime and kubelet start (they already see the modules); the daemon then
    writes the metrics textfile with the phase the boot left. Both units write the node's
    labels into node-feature-discovery's features.d through their sandboxes: the boot after
    the load, the daemon after taking in (here refusing) a drop, and neither fails to."""
    modules = {}
    for name in ("ms_exporter", "ms_params", "ms_firmware"):
        signed = kmod.sign(kernel, test_modules[name], key, tmp_path / f"{name}.ko")
        modules[name] = node.put(signed, f"vendor/{name}.ko")
    (tmp_path / "test.bin").write_bytes(b"f" * 4321)
    firmware = node.put(tmp_path / "test.bin", "vendor/fw/modstage/test.bin").rsplit("/", 2)[0]
    stage = ["modstage", "stage", "--into", "/var/lib/modstage/incoming", "--bundle", "test"]
    stage += ["--version", "1", "--kernel", kernel.release, "--module", modules["ms_exporter"]]
    stage += ["--module", f"{modules['ms_params']}:count=7", "--module", modules["ms_firmware"]]
    stage += ["--firmware", firmware, "--memory", "online_movable"]
    node.run(stage).check()
    wait_for_reboot(node, 240)
    intent = state(node).reboot
    assert intent is not None and intent.backend == "systemd" and intent.bundles == ("test",)

    node.start()
    require_systemd(node)
    boot = show(node, BOOT, "ActiveState", "Result", "ExecMainStatus")
    assert boot == {"ActiveState": "active", "Result": "success", "ExecMainStatus": "0"}
    assert {"ms_exporter", "ms_params"} <= set(live_modules(node))
    assert node.read("/sys/module/ms_params/parameters/count") == "7"
    assert node.read("/sys/module/ms_firmware/parameters/fw_size") == "4321"
    assert node.read("/sys/module/firmware_class/parameters/path") == "/run/modstage/firmware"
    assert node.read("/sys/devices/system/memory/auto_online_blocks") == "online_movable"
    assert state(node).bundle("test").phase is Phase.ACTIVE
    loaded = active_since(node, BOOT)
    assert 0 < loaded <= active_since(node, "sysinit.target")
    for runtime in ("containerd", "kubelet"):
        assert loaded <= started(node, f"{runtime}.service")
        assert "ms_params " in node.read(f"{SAW}/{runtime}"), f"{runtime} started before the load"
    poll(
        lambda: any(e["event"] == "reboot.happened" for e in events(journal(node, DAEMON))),
        120,
        "the daemon to reconcile the reboot",
    )
    # the boot retired the textfile of the boot before; the daemon's first pass wrote this one
    poll(
        lambda: (
            'modstage_bundle_phase{bundle="test",phase="active"} 1'
            in node.run(f"cat {METRICS}").stdout
        ),
        60,
        "the daemon's metrics textfile",
    )
    features = f"{FEATURES_DIR}/modstage"
    assert "labels.written" in [e["event"] for e in events(journal(node, BOOT))]
    assert "test.phase=active" in node.read(features)
    node.run(["rm", features]).check()
    other = ["modstage", "stage", "--into", "/var/lib/modstage/incoming", "--bundle", "test"]
    other += ["--version", "2", "--kernel", "0.0.0-not-this-one"]
    node.run([*other, "--module", modules["ms_params"]]).check()  # refused: another kernel
    poll(lambda: node.run(["test", "-f", features]).rc == 0, 120, "the daemon's labels")
    assert "test.phase=active" in node.read(features)
    written = [e["event"] for unit in (BOOT, DAEMON) for e in events(journal(node, unit))]
    assert "labels.write_failed" not in written and written.count("labels.written") >= 2


def test_daemon_pets_the_watchdog_logs_priorities_restarts_and_stops(node: Vm) -> None:
    """The watchdog timestamp advances while the daemon runs (no watchdog kill); it onlines
    hot-added memory through its sandbox; an error is filed at err priority, info is not;
    SIGKILL brings a restart; ``systemctl stop`` ends it cleanly."""
    first = show(node, DAEMON, "MainPID", "WatchdogTimestampMonotonic", "WatchdogUSec")
    assert first["WatchdogUSec"] == "30s"
    poll(
        lambda: (
            show(node, DAEMON, "WatchdogTimestampMonotonic")["WatchdogTimestampMonotonic"]
            != first["WatchdogTimestampMonotonic"]
        ),
        45,
        "WATCHDOG=1",
    )
    assert show(node, DAEMON, "MainPID", "NRestarts") == {
        "MainPID": first["MainPID"],
        "NRestarts": "0",
    }

    # Hot-added memory, left offline by the kernel, is onlined by the sandboxed daemon.
    node.python("write('/sys/devices/system/memory/auto_online_blocks', 'offline')")
    node.hotplug_memory("256M")
    onlined = poll(
        lambda: (
            (o := [e for e in events(journal(node, DAEMON)) if e["event"] == "memory.onlined"])
            and len(o) >= 2
            and o
        ),
        90,
        "the daemon to online both hot-added blocks",
    )
    assert not [e for e in events(journal(node, DAEMON)) if e["event"] == "memory.online_failed"]
    for step in onlined:
        assert node.read(f"/sys/devices/system/memory/memory{step['block']}/state") == "online"

    good = (node.state_dir / "state.json").read_bytes()
    node.run(
        "echo 'not json' > /var/lib/modstage/state.json && mkdir /var/lib/modstage/incoming/poke"
    )
    errors = poll(lambda: events(journal(node, DAEMON, priority="err")), 60, "an error logged")
    assert {e["event"] for e in errors} >= {"daemon.step_failed"}
    assert all(e["PRIORITY"] <= 3 and e["level"] == "error" for e in errors), errors
    everything = events(journal(node, DAEMON))
    assert any(e["event"] == "daemon.ready" and e["PRIORITY"] == 6 for e in everything)
    (node.state_dir / "state.json").write_bytes(good)
    for aside in node.state_dir.glob("state.json.corrupt-*"):
        aside.unlink()

    node.run(["kill", "-9", first["MainPID"]]).check()
    again = poll(
        lambda: (
            (s := show(node, DAEMON, "MainPID", "ActiveState", "NRestarts"))["ActiveState"]
            == "active"
            and s["MainPID"] not in ("0", first["MainPID"])
            and s
        ),
        120,
        "the restart after SIGKILL",
    )
    assert again["NRestarts"] == "1"

    node.run(["systemctl", "stop", DAEMON], timeout=120).check()
    stopped = show(node, DAEMON, "ActiveState", "Result", "ExecMainCode", "ExecMainStatus")
    assert stopped == {
        "ActiveState": "inactive",
        "Result": "success",
        "ExecMainCode": "1",
        "ExecMainStatus": "0",
    }
    assert any(e["event"] == "daemon.stopped" for e in events(journal(node, DAEMON)))

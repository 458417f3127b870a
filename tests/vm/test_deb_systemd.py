"""modstage's Debian package installed on a node under systemd as PID 1, on a real kernel.

One node per kernel, three boots. The node's root keeps what is written to it across
reboots, as an installed Debian host's does: the root's overlay has its upper layer on an
ext4 disk of its own (``Vm(root_disk=...)``). Boot 1: the package built from this tree
(``deploy/debian/build``, as tests/test_deb.py builds it) is installed with ``apt-get install
./modstage_*_all.deb``, so its maintainer scripts run (on 6.1, the host's Debian 12 root, the
python3 libraries apt would fetch are handed in beside it; the Debian 13 root already has
them). The packaged daemon hears a module tree appearing and the package's kernel hook.
systemd-analyze scores the packaged units as it scores deploy/systemd's. The node is a
fresh one whose boot unit was skipped (no state at boot): a drop is taken in and its
generation waits for kured's reboot; the daemon killed, the package upgraded to a newer
build, the daemon restarted and the boot unit started by hand each leave the running
kernel's modules and the bundle's record alone. Boot 2 (``systemctl reboot``, as kured
does): the boot unit loads the generation. The admin then writes a config with the systemd
reboot backend into /etc/modstage and restarts the daemon; a second drop is taken in and the
daemon reboots the node. Boot 3: the package's boot unit loads the generation and
``modstage status`` says healthy.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import tempfile
import tomllib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from service.bundles.phase import Phase
from tests.kmod import SigningKey, cache_root, make_key
from tests.test_units import TARGETS
from tests.vm.harness import Vm, VmFactory, kmod
from tests.vm.harness.disk import make_ext4_image
from tests.vm.harness.errors import VmBootError
from tests.vm.harness.kernel import Kernel
from tests.vm.harness.systemd import events, journal, poll, require_systemd, show, systemd_args
from tests.vm.node import live_modules, prepare, state
from tests.vm.test_systemd import BOOT, CONFIG, DAEMON, active_since, wait_for_reboot

pytestmark = [pytest.mark.vm, pytest.mark.kernels("6.1", "6.12")]
ROOT = Path(__file__).resolve().parents[2]  # the repository: the same path in the guest
SCORE = re.compile(r"Overall exposure level for \S+: (\d+\.\d)")
INST = re.compile(r"^Inst (\S+) \((\S+) .*\[(\S+)\]\)$", re.MULTILINE)
NONINTERACTIVE = {"DEBIAN_FRONTEND": "noninteractive"}


@pytest.fixture(scope="module")
def key(tmp_path_factory: pytest.TempPathFactory) -> SigningKey:
    """The vendor's signing key."""
    return make_key(tmp_path_factory.mktemp("deb-key"), "rsa4096", cn="deb vendor")


@pytest.fixture(scope="module")
def deb(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The package built from this tree (0.1.0), as tests/test_deb.py builds it (6 s)."""
    out = tmp_path_factory.mktemp("deb")
    argv = [str(ROOT / "deploy/debian/build"), "--out", str(out)]
    done = subprocess.run(argv, capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stderr[-4000:]
    return Path(done.stdout.strip().splitlines()[-1])


def fetched_by_apt(deb: Path) -> dict[str, str]:
    """What this host's apt would download to install `deb` (``apt-get -s``): the file name
    `apt-get download` gives each package -> ``name=version`` to ask it for."""
    argv = ["apt-get", "-s", "install", str(deb)]
    done = subprocess.run(argv, capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stdout + done.stderr
    return {
        f"{name}_{version.replace(':', '%3a')}_{arch}.deb": f"{name}={version}"
        for name, version, arch in INST.findall(done.stdout)
        if name != "modstage"
    }


def downloaded(packages: dict[str, str]) -> list[Path]:
    """`packages` (see `fetched_by_apt`) from this host's archive, downloaded once (cached)."""
    cache = cache_root() / "deb-dependencies"
    cache.mkdir(exist_ok=True)
    missing = [wanted for file, wanted in packages.items() if not (cache / file).exists()]
    if missing:
        argv = ["apt-get", "-oAPT::Sandbox::User=root", "download", "-qq", *missing]
        subprocess.run(argv, cwd=cache, check=True, timeout=600)
    return [cache / file for file in packages]


@pytest.fixture(scope="module")
def newer_deb(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The same tree built as 0.1.1: the upgrade an admin's ``apt-get install`` brings."""
    out = tmp_path_factory.mktemp("deb-newer")
    argv = [str(ROOT / "deploy/debian/build"), "--out", str(out), "--version", "0.1.1"]
    done = subprocess.run(argv, capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stderr[-4000:]
    return Path(done.stdout.strip().splitlines()[-1])


@pytest.fixture(scope="module")
def packages(deb: Path, newer_deb: Path, kernel: Kernel) -> Iterator[str]:
    """The package, and on 6.1 the libraries the host's root lacks, in a directory of the
    node's root (its /tmp: the guest sees the root as it is at boot); its guest path. The
    newer build waits in its ``newer/`` subdirectory."""
    placed = Path(tempfile.mkdtemp(prefix="modstage-deb-", dir=kernel.root / "tmp"))
    placed.chmod(0o755)  # apt reads local packages as its unprivileged user
    try:
        shutil.copy(deb, placed)
        (placed / "newer").mkdir(mode=0o755)
        shutil.copy(newer_deb, placed / "newer")
        if not kernel.own_root:  # Debian 12's own python3 libraries, from its archive
            for dependency in downloaded(fetched_by_apt(deb)):
                shutil.copy(dependency, placed)
        yield "/" + str(placed.relative_to(kernel.root))
    finally:
        shutil.rmtree(placed, ignore_errors=True)


@pytest.fixture(scope="module")
def node(
    boot_vm: VmFactory, tmp_path_factory: pytest.TempPathFactory, kernel: Kernel
) -> Iterator[Vm]:
    """The node, booted with systemd as PID 1 and its root's changes kept on a disk."""
    disk = tmp_path_factory.mktemp(f"deb-root-{kernel.series}") / "root.img"
    make_ext4_image(disk, 1 << 30, label="modstage-root")
    vm = boot_vm("deb", kernel_args=systemd_args(), root_disk=disk)
    require_systemd(vm)
    # 6.1's root is this build host's, whose man-db rebuilds the index of every installed
    # package's manuals on each dpkg run (minutes under TCG); a node's root need not
    vm.run(["rm", "-f", "/var/lib/man-db/auto-update"]).check()
    yield vm
    vm.close()


def installed(vm: Vm) -> bool:
    """Whether dpkg has the package installed and configured on the node."""
    status = vm.run(["dpkg-query", "-W", "-f", "${Status}", "modstage"]).stdout
    return status == "install ok installed"


def exposure(vm: Vm, *argv: str) -> float:
    """The overall exposure level ``systemd-analyze security ARGV`` gives (the node's systemd)."""
    done = vm.run(["systemd-analyze", "security", "--no-pager", *argv], timeout=120)
    match = SCORE.search(done.stdout)
    assert match, f"no score from {argv}:\n{done.stdout}{done.stderr}"
    return float(match[1])


def test_apt_installs_the_package_enables_both_units_and_starts_the_daemon(
    node: Vm, packages: str
) -> None:
    """``apt-get install ./modstage_*_all.deb`` on the running node: dpkg configures it, its
    postinst enables both units and starts the daemon (READY with the shipped example
    config's reboot backend), never the boot unit (skipped on its condition until there is
    state); the units run /usr/bin/modstage, which is on the PATH; dpkg owns the state
    directory."""
    # a build container's root (6.1's is the host's) forbids starting services from a
    # maintainer script (policy-rc.d exits 101); a Debian host has none
    node.run(["rm", "-f", "/usr/sbin/policy-rc.d"]).check()
    files = node.run(f"ls {packages}/*.deb").check().stdout.split()
    done = node.run(["apt-get", "install", "--yes", *files], env=NONINTERACTIVE, timeout=900)
    assert done.rc == 0 and "Setting up modstage (0.1.0)" in done.stdout, (
        done.stdout[-4000:] + done.stderr[-4000:]
    )
    assert installed(node)
    assert node.run(["systemctl", "is-enabled", BOOT, DAEMON]).stdout.split() == ["enabled"] * 2
    daemon = show(node, DAEMON, "ActiveState", "SubState", "NRestarts", "ExecStart")
    assert (daemon["ActiveState"], daemon["SubState"], daemon["NRestarts"]) == (
        "active",
        "running",
        "0",
    ), daemon
    assert "path=/usr/bin/modstage " in daemon["ExecStart"], daemon
    shipped = tomllib.loads((ROOT / "deploy/config.example.toml").read_text())
    ready = [e for e in events(journal(node, DAEMON)) if e["event"] == "daemon.ready"]
    assert [e["backend"] for e in ready] == [shipped["reboot"]["backend"]], ready
    boot = show(node, BOOT, "ActiveState", "ConditionResult", "ExecStart")
    assert (boot["ActiveState"], boot["ConditionResult"]) == ("inactive", "no"), boot
    assert "path=/usr/bin/modstage " in boot["ExecStart"], boot
    assert node.run("command -v modstage").stdout.strip() == "/usr/bin/modstage"
    owner = node.run(["dpkg-query", "-S", "/var/lib/modstage"]).stdout.strip()
    assert owner == "modstage: /var/lib/modstage", owner


def test_the_packaged_daemon_hears_a_kernel_tree_and_the_packages_kernel_hook(
    node: Vm,
) -> None:
    """Under its unit's sandbox the packaged daemon watches the boot directory, the module
    trees' directory (as the root resolves ``/lib/modules``) and ``/run/modstage/kernel-hook``,
    which it made; a module tree appearing is a ``kernels.changed`` refresh within seconds,
    and the package's hook, run as a kernel package runs ``/etc/kernel/postinst.d`` (``run-parts
    --exit-on-error``, only it selected: Debian's own hooks would build an initramfs), exits
    0 and is a ``kernels.hook`` scan."""
    assert installed(node), "the install test did not pass"

    def daemon_events(name: str) -> list[dict[str, Any]]:
        return [e for e in events(journal(node, DAEMON)) if e["event"] == name]

    [watching] = poll(lambda: daemon_events("kernels.watching"), 60, "kernels.watching")
    trees = node.eval("os.path.realpath('/lib/modules')")
    assert {"/boot", trees, "/run/modstage/kernel-hook"} <= set(watching["dirs"]), watching
    tree = "/lib/modules/0.0.1-hooktest"
    node.run(["mkdir", tree]).check()
    try:
        changed = poll(lambda: daemon_events("kernels.changed"), 60, "kernels.changed")
        assert any(tree in p for e in changed for p in e["paths"]), changed
        hook = [
            "run-parts", "--report", "--exit-on-error", "--regex", "^zzz-modstage$",
            "--arg=0.0.1-hooktest", "--arg=/boot/vmlinuz-0.0.1-hooktest", "/etc/kernel/postinst.d",
        ]  # fmt: skip
        ran = node.run(hook)
        assert (ran.rc, ran.stderr) == (0, ""), ran
        [heard] = poll(lambda: daemon_events("kernels.hook"), 60, "kernels.hook")
        assert heard["files"] == ["/run/modstage/kernel-hook/installed"], heard
        assert node.read("/run/modstage/kernel-hook/installed") == "installed 0.0.1-hooktest"
    finally:
        node.run(["rmdir", tree]).check()


def test_systemd_scores_the_packaged_units_as_the_installers(node: Vm) -> None:
    """systemd-analyze security (the node's own systemd) gives each packaged unit, loaded
    and as its file, the exposure it gives the same unit in deploy/systemd (the file
    deploy/install.sh installs unchanged), within tests/test_units.py's target."""
    assert installed(node), "the package is not installed (see the test before)"
    for source, target in TARGETS.items():
        path = show(node, source.name, "FragmentPath")["FragmentPath"]
        assert path.endswith(f"/lib/systemd/system/{source.name}"), path
        loaded = exposure(node, source.name)
        packaged = exposure(node, "--offline=yes", path)
        installer = exposure(node, "--offline=yes", str(source))
        assert loaded == packaged == installer <= target, (
            f"{source.name}: loaded {loaded}, packaged {packaged}, install.sh's {installer}"
        )


GUARD_CONFIG = """\
allowed_bundles = ["test"]
[reboot]
backend = "kured"
sentinel = "/run/modstage/reboot-required"
min_delay = 0
"""
SENTINEL = "/run/modstage/reboot-required"


@dataclass(frozen=True)
class Waiting:
    """What must not change while a generation waits for its reboot on a running node."""

    modules: frozenset[str]
    phase: Phase
    pending: str | None
    history: int
    reboot: object


def waiting(node: Vm) -> Waiting:
    """The node's loaded modules and bundle ``test``'s record as they are now."""
    bundle = state(node).bundle("test")
    return Waiting(
        frozenset(live_modules(node)),
        bundle.phase,
        bundle.pending,
        len(bundle.history),
        state(node).reboot,
    )


def broken_by(node: Vm, case: str, before: Waiting) -> list[str]:
    """What ``case`` changed that it must not have: a module loaded or unloaded, the
    bundle's phase, pending generation or history, a failure recorded, the reboot intent
    or kured's sentinel gone, ``status --reboot-required`` no longer 0, or any load or
    unload the boot unit logged in this boot."""
    now = waiting(node)
    found = []
    if now.modules != before.modules:
        found.append(f"{case}: modules {sorted(before.modules ^ now.modules)} loaded or unloaded")
    for name in ("phase", "pending", "history", "reboot"):
        if getattr(now, name) != getattr(before, name):
            found.append(f"{case}: {name} {getattr(before, name)!r} -> {getattr(now, name)!r}")
    failed = [g for g in state(node).bundle("test").generations.values() if g.failed]
    if failed:
        found.append(f"{case}: marked failed: {[g.failed for g in failed]}")
    if node.run(["test", "-e", SENTINEL]).rc != 0:
        found.append(f"{case}: kured's sentinel is gone")
    required = node.run(["modstage", "status", "--reboot-required"], timeout=120).rc
    if required != 0:
        found.append(f"{case}: status --reboot-required exits {required}")
    acted = [
        e["event"]
        for e in events(journal(node, BOOT))
        if e["event"].startswith(("generation.", "module.", "bundle.", "memory.", "firmware."))
    ]
    if acted:
        found.append(f"{case}: the boot unit acted in the running system: {acted}")
    return found


def daemon_ready(node: Vm, old_pid: str) -> str:
    """Wait until a daemon other than ``old_pid`` is active (READY: ``Type=notify``); its PID."""
    return str(
        poll(
            lambda: (
                (s := show(node, DAEMON, "ActiveState", "MainPID"))["ActiveState"] == "active"
                and s["MainPID"] not in ("0", old_pid)
                and s["MainPID"]
            ),
            180,
            f"a daemon other than {old_pid} to be active",
        )
    )


def test_upgrades_restarts_and_crashes_never_run_the_boot_on_the_live_node(
    node: Vm,
    kernel: Kernel,
    test_modules: dict[str, Path],
    key: SigningKey,
    tmp_path: Path,
    packages: str,
) -> None:
    """A node whose boot unit was skipped at boot (no state then: the package was installed
    on the running node) takes a drop in; its generation waits for kured's reboot (the
    sentinel written, the intent recorded). Then, each on the running node: (c) the daemon
    killed and restarted by ``Restart=``, (a) ``apt-get install`` of a newer build of the
    package (its maintainer scripts), (b) ``systemctl restart modstage.service``, (e) an
    admin's ``systemctl start modstage-boot.service``. After each: no module loaded or
    unloaded, nothing marked failed, the bundle's record and the reboot request unchanged,
    ``status --reboot-required`` still 0, no load logged by the boot unit; the admin's start
    says ``boot.already_done`` (the daemon closed this boot). Every case is checked before
    the test fails, so one run names each that breaks. Then kured's reboot (``systemctl
    reboot``): the boot unit loads the generation and ``status`` is healthy."""
    assert installed(node), "the package is not installed (see the tests before)"
    prepare(node, {"vendor.pem": key.cert_pem.read_bytes()}, GUARD_CONFIG)
    node.run(["sync"]).check()
    node.run(["systemctl", "restart", DAEMON], timeout=180).check()
    signed = kmod.sign(kernel, test_modules["ms_exporter"], key, tmp_path / "ms_exporter.ko")
    module = node.put(signed, "vendor/ms_exporter.ko")
    stage = ["modstage", "stage", "--into", "/var/lib/modstage/incoming", "--bundle", "test"]
    node.run([*stage, "--version", "0", "--kernel", kernel.release, "--module", module]).check()
    poll(lambda: node.run(["test", "-e", SENTINEL]).rc == 0, 180, "kured's sentinel")
    before = waiting(node)
    assert before.phase is Phase.REBOOT_SCHEDULED and before.pending, before
    assert "ms_exporter" not in before.modules
    boot = show(node, BOOT, "ActiveState", "ConditionResult")
    assert boot == {"ActiveState": "inactive", "ConditionResult": "no"}, boot
    broken: list[str] = []

    pid = show(node, DAEMON, "MainPID")["MainPID"]
    node.run(["kill", "-9", pid]).check()
    pid = daemon_ready(node, pid)  # Restart=on-failure, RestartSec=5s
    broken += broken_by(node, "(c) daemon killed", before)

    newer = node.run(f"ls {packages}/newer/*.deb").check().stdout.split()
    done = node.run(["apt-get", "install", "--yes", *newer], env=NONINTERACTIVE, timeout=900)
    assert done.rc == 0 and "Setting up modstage (0.1.1)" in done.stdout, (
        done.stdout[-4000:] + done.stderr[-4000:]
    )
    pid = daemon_ready(node, pid)  # the postinst's restart
    broken += broken_by(node, "(a) apt-get install of 0.1.1", before)

    node.run(["systemctl", "restart", DAEMON], timeout=180).check()
    daemon_ready(node, pid)
    broken += broken_by(node, "(b) systemctl restart", before)

    started = node.run(["systemctl", "start", BOOT], timeout=180)
    broken += broken_by(node, "(e) systemctl start modstage-boot", before)
    said = [e for e in events(journal(node, BOOT)) if e["event"] == "boot.already_done"]
    if started.rc != 0 or [e["by"] for e in said] != ["daemon"]:
        broken.append(f"(e) the boot unit did not say the daemon closed this boot: {said}")
    assert not broken, "\n".join(broken)

    # as kured does in its window; from a timer, so that the agent's reply is out before
    # the guest goes down
    node.run(["systemd-run", "--on-active=3", "systemctl", "reboot"]).check()
    wait_for_reboot(node, 300)
    node.start()
    require_systemd(node)
    boot = show(node, BOOT, "ActiveState", "Result", "ExecMainStatus")
    assert boot == {"ActiveState": "active", "Result": "success", "ExecMainStatus": "0"}, boot
    assert "ms_exporter" in live_modules(node)
    bundle = state(node).bundle("test")
    assert (bundle.phase, bundle.active, bundle.pending) == (Phase.ACTIVE, before.pending, None)
    assert node.run(["dpkg-query", "-W", "-f", "${Version}", "modstage"]).stdout == "0.1.1"
    done = node.run(["modstage", "status", "--json"], timeout=120)
    assert done.rc == 0 and json.loads(done.stdout)["health"] == "healthy", done.stdout


def test_a_staged_driver_is_taken_in_rebooted_into_and_loaded_by_the_package(
    node: Vm, kernel: Kernel, test_modules: dict[str, Path], key: SigningKey, tmp_path: Path
) -> None:
    """With the admin's config (systemd backend) and certificate in /etc/modstage and the
    daemon restarted, a drop staged with the packaged ``modstage stage`` is taken in and the
    daemon reboots the node. At the next boot the package is still installed, its boot unit
    has loaded the generation before sysinit.target (the parameter set), ``modstage status``
    exits 0 with the bundle healthy and each module live (its recorded srcversion), the boot
    unit logged no error (the previous boot's metrics textfile removed within its sandbox),
    and the daemon reconciles the reboot."""
    assert installed(node), "the package is not installed (see the tests before)"
    prepare(node, {"vendor.pem": key.cert_pem.read_bytes()}, CONFIG)
    # on 6.1 the certificate, a new file, came back empty after the daemon's reboot without
    # this (delayed allocation on the root disk; systemd 252's shutdown did not write it)
    node.run(["sync"]).check()
    node.run(["systemctl", "restart", DAEMON], timeout=180).check()
    ready = [e for e in events(journal(node, DAEMON)) if e["event"] == "daemon.ready"]
    assert ready[-1]["backend"] == "systemd", ready
    modules = {}
    for name in ("ms_exporter", "ms_params"):
        signed = kmod.sign(kernel, test_modules[name], key, tmp_path / f"{name}.ko")
        modules[name] = node.put(signed, f"vendor/{name}.ko")
    stage = ["modstage", "stage", "--into", "/var/lib/modstage/incoming", "--bundle", "test"]
    stage += ["--version", "1", "--kernel", kernel.release, "--module", modules["ms_exporter"]]
    node.run([*stage, "--module", f"{modules['ms_params']}:count=7"]).check()
    metrics = "/var/lib/prometheus/node-exporter/modstage.prom"
    assert node.run(["test", "-s", metrics]).rc == 0, "the daemon wrote no metrics to retire"
    wait_for_reboot(node, 300)
    intent = state(node).reboot
    assert intent is not None and intent.backend == "systemd" and intent.bundles == ("test",)

    node.start()
    try:
        require_systemd(node)
    except VmBootError as exc:
        pytest.fail(f"{exc}\n{node.run(['journalctl', '-b', '--no-pager', '-u', BOOT]).stdout}")
    assert installed(node), "the package did not survive the reboot"
    boot = show(node, BOOT, "ActiveState", "Result", "ExecMainStatus")
    assert boot == {"ActiveState": "active", "Result": "success", "ExecMainStatus": "0"}
    # the previous boot's metrics (the daemon's, kept on this root) removed, not refused by
    # the unit's sandbox (ProtectSystem=strict with the directory writable)
    said = [e for e in events(journal(node, BOOT)) if e.get("level") in ("error", "critical")]
    assert said == [], said
    assert 0 < active_since(node, BOOT) <= active_since(node, "sysinit.target")
    assert {"ms_exporter", "ms_params"} <= set(live_modules(node))
    assert node.read("/sys/module/ms_params/parameters/count") == "7"
    assert state(node).bundle("test").phase is Phase.ACTIVE
    done = node.run(["/usr/bin/modstage", "status", "--json"], timeout=120)
    doc = json.loads(done.stdout)
    assert done.rc == 0 and doc["health"] == "healthy", doc["problems"]
    loaded = doc["bundles"]["test"]["loaded"]
    assert sorted(m["module"] for m in loaded) == ["ms_exporter", "ms_params"], loaded
    for module in loaded:
        assert module["live"] is not None, module
        assert module["live"]["srcversion"] == module["srcversion"], module
    poll(
        lambda: any(e["event"] == "reboot.happened" for e in events(journal(node, DAEMON))),
        120,
        "the daemon to reconcile the reboot",
    )

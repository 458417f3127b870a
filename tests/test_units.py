"""The systemd units are hardened: systemd's own scorer grades them, and the sandbox leaves
each unit exactly the privileges its job needs (the daemon never loads a module)."""

from __future__ import annotations

import re
import shutil
import subprocess
import tempfile
from pathlib import Path

import pytest

pytestmark = pytest.mark.debian  # systemd-analyze, and a Debian 13 root of the test cache

SYSTEMD = Path(__file__).resolve().parents[1] / "deploy/systemd"
DAEMON = SYSTEMD / "modstage.service"
BOOT = SYSTEMD / "modstage-boot.service"
# at most 4.0 for the daemon, 6.0 for the boot oneshot (0 safe ... 10 unsafe).
TARGETS = {DAEMON: 4.0, BOOT: 6.0}


def exposure(unit: Path, chroot: Path | None = None) -> float:
    """``systemd-analyze security --offline=yes``'s overall exposure level for ``unit``: the
    host's systemd (Debian 12's 252), or with ``chroot`` the one of that root, run inside it
    (``unit`` then a path inside the root)."""
    if chroot is None:
        analyze = shutil.which("systemd-analyze")
        if analyze is None:
            pytest.fail("systemd-analyze is missing: apt-get install systemd (see .ci/install)")
        argv = [analyze]
    else:
        argv = ["chroot", str(chroot), "systemd-analyze"]
    done = subprocess.run(
        [*argv, "security", "--offline=yes", "--no-pager", str(unit)],
        capture_output=True,
        text=True,
        check=False,
        env={"PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "LANG": "C.UTF-8"},
    )
    match = re.search(rf"Overall exposure level for {re.escape(unit.name)}: (\d+\.\d)", done.stdout)
    assert match, f"no score for {unit.name}:\n{done.stdout}{done.stderr}"
    return float(match[1])


def service(unit: Path) -> dict[str, list[str]]:
    """The [Service] section's keys (repeatable) with their values."""
    keys: dict[str, list[str]] = {}
    section = ""
    for line in unit.read_text().splitlines():
        if line.startswith("["):
            section = line.strip("[]")
        elif section == "Service" and "=" in line and not line.startswith("#"):
            key, _, value = line.partition("=")
            keys.setdefault(key.strip(), []).append(value.strip())
    return keys


@pytest.mark.parametrize("unit", list(TARGETS), ids=lambda p: p.name)
def test_exposure_score_meets_the_target(unit: Path) -> None:
    """systemd scores the daemon at most 4.0 and the boot unit at most 6.0."""
    score = exposure(unit)
    assert score <= TARGETS[unit], f"{unit.name} scores {score}, target {TARGETS[unit]}"


def test_debian_13s_systemd_scores_the_units_no_worse_than_debian_12s(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """Debian 13's systemd (257, run in a Debian 13 root with chroot) scores each unit within
    its target and no worse than the host's Debian 12 systemd does; both scores are printed."""
    from tests.vm.harness import debian

    root = debian.install_root()
    scratch = Path(tempfile.mkdtemp(prefix="modstage-units-", dir=root / "tmp"))
    try:
        lines = []
        for unit in TARGETS:
            shutil.copy(unit, scratch / unit.name)
            old = exposure(unit)
            new = exposure(Path(f"/tmp/{scratch.name}/{unit.name}"), chroot=root)
            lines.append(f"{unit.name}: Debian 12 (systemd 252) {old}, Debian 13 (257) {new}")
            assert new <= TARGETS[unit] and new <= old, lines[-1]
        with capsys.disabled():
            print("\n" + "\n".join(lines))
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def test_the_scorer_notices_a_regression(tmp_path: Path) -> None:
    """Without its sandbox the daemon's unit scores above its target (the test can fail)."""
    lines = DAEMON.read_text().split("# --- Sandbox.")[0]
    bare = tmp_path / "modstage.service"
    bare.write_text(lines + "\n[Install]\nWantedBy=multi-user.target\n")
    assert exposure(bare) > TARGETS[DAEMON]


def test_daemon_cannot_load_modules() -> None:
    """The daemon's bounding set lacks CAP_SYS_MODULE and its filter lacks @module: it never
    loads or unloads a module. ProtectKernelModules= stays off, because it would hide
    /usr/lib/modules, where intake reads the target kernel's vermagic and symbol CRCs."""
    keys = service(DAEMON)
    (caps,) = keys["CapabilityBoundingSet"]
    assert "CAP_SYS_MODULE" not in caps.split() and not caps.startswith("~")
    assert keys.get("ProtectKernelModules", ["no"]) == ["no"]
    assert not any("@module" in f and not f.startswith("~") for f in keys["SystemCallFilter"])


def test_boot_unit_keeps_exactly_module_loading() -> None:
    """The boot unit's only capability is CAP_SYS_MODULE, with @module allowed, and the sysfs
    files the loader writes (memory onlining, firmware_class.path) writable."""
    keys = service(BOOT)
    assert keys["CapabilityBoundingSet"] == ["CAP_SYS_MODULE"]
    assert any("@module" in f.split() for f in keys["SystemCallFilter"])
    writable = " ".join(keys["ReadWritePaths"]).split()
    assert {"-/sys/devices/system/memory", "-/sys/module/firmware_class/parameters"} <= set(
        writable
    )
    assert keys["ProtectKernelTunables"] == ["yes"] and keys["ProtectSystem"] == ["strict"]


@pytest.mark.parametrize("unit", list(TARGETS), ids=lambda p: p.name)
def test_state_and_runtime_directories_survive_a_stop(unit: Path) -> None:
    """Both units share /var/lib/modstage and /run/modstage, and stopping either keeps the
    runtime directory (the firmware view and the reboot sentinel live there)."""
    keys = service(unit)
    assert keys["StateDirectory"] == ["modstage"] and keys["RuntimeDirectory"] == ["modstage"]
    assert keys["RuntimeDirectoryPreserve"] == ["yes"]


def unit_conditions(unit: Path) -> list[tuple[str, str]]:
    """The [Unit] section's ``Condition*`` lines as (key, value) pairs, in order."""
    section, found = "", []
    for line in unit.read_text().splitlines():
        if line.startswith("["):
            section = line.strip("[]")
        elif section == "Unit" and line.startswith("Condition"):
            key, _, value = line.partition("=")
            found.append((key, value))
    return found


def test_boot_unit_runs_whenever_there_is_a_state_to_recover() -> None:
    """The boot unit starts on a state, a set-aside corrupt state, or the last-good pointer.

    With only ``state.json`` as its condition, a boot that set a corrupt state aside and
    crashed before rebuilding would skip the unit on every later boot and leave the node
    without its last good modules. Each path is the one ``Layout`` and
    ``service.bundles.state`` use on a host.
    """
    from service.bundles.statefile import LAST_GOOD
    from service.layout import Layout

    state = Layout(Path("/")).state
    conditions = unit_conditions(BOOT)
    assert ("ConditionPathExists", f"|{state}") in conditions
    assert ("ConditionPathExistsGlob", f"|{state}.corrupt-*") in conditions
    assert ("ConditionPathExists", f"|{state.parent / LAST_GOOD}") in conditions
    assert all(value.startswith("|") for _, value in conditions), "one plain condition gates all"


@pytest.mark.parametrize("unit", [DAEMON, BOOT], ids=lambda p: p.name)
def test_both_units_may_write_the_node_feature_directory(unit: Path) -> None:
    """`ProtectSystem=strict` makes /etc read-only: each unit names node-feature-discovery's
    features.d (the directory the labels are written to, `service.publish.labels`) among its
    ReadWritePaths=, with "-" so that a host without NFD starts the unit all the same."""
    from service.publish.labels import FEATURES_DIR

    writable = [
        word
        for line in unit.read_text().splitlines()
        if line.startswith("ReadWritePaths=")
        for word in line.split("=", 1)[1].split()
    ]
    assert f"-{FEATURES_DIR}" in writable


def unit_section(unit: Path) -> dict[str, list[str]]:
    """The [Unit] section's keys (repeatable) with their values, each split on spaces."""
    keys: dict[str, list[str]] = {}
    section = ""
    for line in unit.read_text().splitlines():
        if line.startswith("["):
            section = line.strip("[]")
        elif section == "Unit" and "=" in line and not line.startswith("#"):
            key, _, value = line.partition("=")
            keys.setdefault(key.strip(), []).extend(value.split())
    return keys


def test_the_daemon_never_pulls_the_boot_unit_in() -> None:
    """The daemon is ordered after the boot unit and depends on it in no way that starts it:
    starting or restarting the daemon (an upgrade, an admin, ``Restart=``) must never run
    ``modstage boot`` in a running system."""
    keys = unit_section(DAEMON)
    assert BOOT.name in keys["After"]
    pulls = ("Wants", "Requires", "Requisite", "BindsTo", "PartOf", "Upholds", "OnSuccess")
    assert not [k for k in pulls if BOOT.name in keys.get(k, [])], keys

"""The staged-reboot cycle on a real kernel: stage -> intake -> reboot -> modstage boot.

Each scenario runs on its own node; reboots are real guest reboots with the state share kept.
On both kernels (Debian 12's 6.1, Debian 13's 6.12 in its Debian 13 root): the vendor's
modules are built and signed for the kernel, and the Debian-signed module is the kernel's own
crc8 (Debian 13 ships it as `crc8.ko.xz`, signed with its ECDSA P-384 build key: it is
decompressed here, so the bundle is the same plain `.ko` on both).
"""

from __future__ import annotations

import lzma
from collections.abc import Iterator
from pathlib import Path

import pytest

from service.bundles.phase import Phase
from tests.kmod import SigningKey, make_key
from tests.vm.harness import Vm, VmExited, VmFactory, kmod
from tests.vm.harness.builtin_key import find_builtin_cert
from tests.vm.harness.kernel import AUTO_ONLINE_AT_BOOT, Kernel
from tests.vm.node import drop, live_modules, modstage, prepare, state, status

pytestmark = [pytest.mark.vm, pytest.mark.kernels("6.1", "6.12", "7.2")]
# crc8 is the kernel's own in-tree module: intake refuses a drop module named like one unless
# the bundle may take that name (docs/verify.md, "A bundle's own modules")
CRC8 = '[bundles.test]\nshadow_in_tree = ["crc8"]\n'


def crc8(kernel: Kernel) -> bytes:
    """The kernel's Debian-signed crc8 module (no dependencies), decompressed if `.ko.xz`."""
    path = kernel.modules / kernel.in_tree("crc8")
    return lzma.decompress(path.read_bytes()) if path.suffix == ".xz" else path.read_bytes()


def build_cert(kernel: Kernel) -> bytes:
    """DER of the kernel's build-time module signing certificate (in its ELF image)."""
    vmlinux = kernel.vmlinux().read_bytes()
    start, length = find_builtin_cert(vmlinux)
    return vmlinux[start : start + length]


@pytest.fixture(scope="module")
def key(tmp_path_factory: pytest.TempPathFactory) -> SigningKey:
    """The signing key of this run's driver vendor."""
    return make_key(tmp_path_factory.mktemp("vendor"), "rsa4096", cn="vendor key")


@pytest.fixture(scope="module")
def signed(
    kernel: Kernel,
    test_modules: dict[str, Path],
    key: SigningKey,
    tmp_path_factory: pytest.TempPathFactory,
) -> dict[str, Path]:
    """Every test module signed with the vendor key by the kernel's own sign-file, plus the
    Debian-signed crc8."""
    out = tmp_path_factory.mktemp(f"signed-boot-{kernel.series}")
    mods = {n: kmod.sign(kernel, p, key, out / p.name) for n, p in test_modules.items()}
    mods["crc8"] = out / "crc8.ko"
    mods["crc8"].write_bytes(crc8(kernel))
    return mods


@pytest.fixture(scope="module")
def certs(kernel: Kernel, key: SigningKey) -> dict[str, bytes]:
    """What the host trusts: the vendor certificate and Debian's build certificate."""
    return {"vendor.pem": key.cert_pem.read_bytes(), "debian.der": build_cert(kernel)}


@pytest.fixture
def release(kernel: Kernel) -> str:
    """The node's kernel release (what the bundles are built for)."""
    return kernel.release


@pytest.fixture
def node(boot_vm: VmFactory, request: pytest.FixtureRequest) -> Iterator[Vm]:
    """A fresh node per scenario (scenarios reboot and leave modules loaded)."""
    vm = boot_vm(request.node.name[:20].replace("[", "-"))
    yield vm
    vm.close()


def _boot(vm: Vm, certs: dict[str, bytes], config: str = "") -> tuple[int, str]:
    prepare(vm, certs, config)
    return modstage(vm, "boot")


def test_staged_generation_loads_after_reboot(
    node: Vm, release: str, signed: dict[str, Path], certs: dict[str, bytes], tmp_path: Path
) -> None:
    """Staged modules load at the next boot in the recorded order, with params and firmware."""
    fw = tmp_path / "fw" / "modstage"
    fw.mkdir(parents=True)
    (fw / "test.bin").write_bytes(b"f" * 4321)
    drop(
        node,
        "test",
        "1",
        release,
        [
            (signed["ms_exporter"], ""),
            (signed["ms_consumer"], ""),
            (signed["ms_params"], 'count=42 label="two words"'),
            (signed["ms_firmware"], ""),
        ],
        firmware_dirs=(tmp_path / "fw",),
    )
    prepare(node, certs)
    rc, out = modstage(node, "intake")
    assert rc == 0, out
    gen = state(node).bundle("test").pending
    assert gen and state(node).bundle("test").phase is Phase.PENDING
    assert not {"ms_exporter", "ms_params"} & set(live_modules(node)), "nothing loads before"

    node.reboot()
    rc, out = _boot(node, certs)
    assert rc == 0, out
    b = state(node).bundle("test")
    assert (b.phase, b.active, b.pending) == (Phase.ACTIVE, gen, None)
    assert [m.module for m in b.loaded] == [
        "ms_exporter",
        "ms_consumer",
        "ms_params",
        "ms_firmware",
    ]
    live = live_modules(node)  # newest first
    assert (
        live.index("ms_firmware")
        < live.index("ms_params")
        < live.index("ms_consumer")
        < live.index("ms_exporter")
    )
    assert node.read("/sys/module/ms_params/parameters/count") == "42"
    assert node.read("/sys/module/ms_params/parameters/label") == "two words"
    assert node.read("/sys/module/ms_firmware/parameters/fw_size") == "4321"
    assert node.read("/sys/module/firmware_class/parameters/path") == "/run/modstage/firmware"
    assert status(node, "test")["phase"] == "active"


def test_enforcing_kernel_refuses_and_last_good_returns(
    node: Vm, release: str, signed: dict[str, Path], certs: dict[str, bytes]
) -> None:
    """Under module.sig_enforce=1 a vendor-signed generation fails with the kernel's reason;
    nothing stays half-loaded and the Debian-signed last known good generation is loaded.
    Then intake's pre-flight asks the kernel's keyrings: the vendor key is refused up front,
    Debian's build key is found."""
    drop(node, "test", "1", release, [(signed["crc8"], "")])
    prepare(node, certs, CRC8)
    assert modstage(node, "intake")[0] == 0
    node.reboot()
    assert _boot(node, certs, CRC8)[0] == 0
    good = state(node).bundle("test").active
    drop(node, "test", "2", release, [(signed["ms_exporter"], ""), (signed["ms_params"], "")])
    assert modstage(node, "intake")[0] == 0  # not enforcing yet: no pre-flight refusal
    bad = state(node).bundle("test").pending

    node.reboot(kernel_args=["module.sig_enforce=1"])
    rc, out = _boot(node, certs, CRC8)
    assert rc == 0, out  # the bundle is active again, on its last known good generation
    b = state(node).bundle("test")
    assert (b.phase, b.active, b.pending) == (Phase.ACTIVE, good, None)
    assert b.generations[str(bad)].failed == (
        "modules/ms_exporter.ko: EKEYREJECTED: the kernel rejected the module's signature"
    )
    live = live_modules(node)
    assert "crc8" in live and "ms_exporter" not in live and "ms_params" not in live

    drop(node, "test", "3", release, [(signed["ms_params"], "")])
    rc, out = modstage(node, "intake")  # now the pre-flight asks the enforcing kernel
    assert (
        rc == 1 and "EKEYREJECTED: the running kernel (module.sig_enforce=1) does not trust" in out
    ), out
    assert state(node).bundle("test").pending is None
    drop(node, "test", "4", release, [(signed["crc8"], "")], memory="offline")
    rc, out = modstage(node, "intake")  # Debian's key is in the kernel's builtin keyring
    assert rc == 0, out
    assert state(node).bundle("test").pending is not None


def test_failing_second_module_unloads_the_first(
    node: Vm, release: str, signed: dict[str, Path], certs: dict[str, bytes]
) -> None:
    """A generation whose second module fails init: the first is unloaded, the LKG is back."""
    drop(node, "test", "1", release, [(signed["ms_exporter"], "")])
    prepare(node, certs)
    modstage(node, "intake")
    node.reboot()
    _boot(node, certs)
    good = state(node).bundle("test").active
    drop(node, "test", "2", release, [(signed["ms_params"], ""), (signed["ms_enodev"], "")])
    modstage(node, "intake")
    node.reboot()
    rc, out = _boot(node, certs)
    b = state(node).bundle("test")
    assert (rc, b.phase, b.active) == (0, Phase.ACTIVE, good), out
    failed = [g.failed for g in b.generations.values() if g.failed]
    assert failed == [
        "modules/ms_enodev.ko: ENODEV: the module's init found no device (init returned -ENODEV)"
    ]
    live = live_modules(node)
    assert "ms_exporter" in live and "ms_params" not in live and "ms_enodev" not in live


def test_panicking_generation_falls_back_after_max_attempts(
    node: Vm, release: str, signed: dict[str, Path], certs: dict[str, bytes]
) -> None:
    """A module that panics the kernel: after max_boot_attempts boots the LKG is loaded."""
    config = "max_boot_attempts = 2\n"
    drop(node, "test", "1", release, [(signed["ms_exporter"], "")])
    prepare(node, certs, config)
    modstage(node, "intake")
    node.reboot()
    _boot(node, certs, config)
    good = state(node).bundle("test").active
    drop(node, "test", "2", release, [(signed["ms_panic"], "")])
    modstage(node, "intake")
    node.reboot()
    for attempt in (1, 2):
        if attempt == 2:
            node.start()  # the node comes back after the panic
        with pytest.raises(VmExited):
            _boot(node, certs, config)  # the kernel panics; qemu ends (-no-reboot, panic=-1)
        assert "ms_panic: deliberate panic from module init" in node.serial_log
        b = state(node).bundle("test")
        assert (b.phase, b.generations[str(b.pending)].attempts) == (Phase.LOADING, attempt)
    node.start()
    rc, out = _boot(node, certs, config)
    b = state(node).bundle("test")
    assert (rc, b.phase, b.active, b.pending) == (0, Phase.ACTIVE, good, None), out
    failed = [g.failed for g in b.generations.values() if g.failed]
    assert failed == ["did not complete boot in 2 attempts (max_boot_attempts)"]
    assert "ms_exporter" in live_modules(node) and "ms_panic" not in live_modules(node)


def test_hot_added_memory_is_onlined_movable_at_boot(
    node: Vm, kernel: Kernel, release: str, signed: dict[str, Path], certs: dict[str, bytes]
) -> None:
    """A DIMM hot-added after the reboot, before ``modstage boot``, ends up online in
    ZONE_MOVABLE when the bundle asks for ``online_movable``.

    The kernels differ in how the blocks wait for boot. 6.1 (``auto_online_blocks`` boots as
    ``offline``): they are offline, and boot onlines every one movable. 6.12 (it boots as
    ``online``): the kernel has already onlined them into ZONE_NORMAL, and boot moves them
    (offline, then ``online_movable``). A block the kernel will not offline by then (EBUSY:
    unmovable pages landed in it; test_memory_hotplug.py sees one block of four to eight)
    stays online in ZONE_NORMAL and ``modstage status`` names exactly those blocks; most of
    the DIMM moves."""
    drop(node, "test", "1", release, [(signed["ms_exporter"], "")], memory="online_movable")
    prepare(node, certs)
    rc, out = modstage(node, "intake")
    assert rc == 0, out
    node.reboot()
    policy = AUTO_ONLINE_AT_BOOT[kernel.series]
    assert node.read("/sys/devices/system/memory/auto_online_blocks") == policy
    before = set(node.eval("sorted(os.listdir('/sys/devices/system/memory'))"))
    node.hotplug_memory("512M")
    added: list[str] = []
    for _ in range(100):
        added = sorted(set(node.eval("sorted(os.listdir('/sys/devices/system/memory'))")) - before)
        if len(added) == 4:
            break
        node.eval("__import__('time').sleep(0.1) or 0")
    assert len(added) == 4, added
    states = {node.read(f"/sys/devices/system/memory/{b}/state") for b in added}
    if policy == "offline":
        assert states == {"offline"}
    else:
        assert states == {"online"}
        zones = {node.read(f"/sys/devices/system/memory/{b}/valid_zones") for b in added}
        assert zones == {"Normal"}
    rc, out = _boot(node, certs)
    assert rc == 0, out
    assert state(node).bundle("test").phase is Phase.ACTIVE, out
    assert node.read("/sys/devices/system/memory/auto_online_blocks") == "online_movable", out
    zone = {b: node.read(f"/sys/devices/system/memory/{b}/valid_zones") for b in added}
    for block in added:
        assert node.read(f"/sys/devices/system/memory/{block}/state") == "online"
    stuck = sorted(b for b, z in zone.items() if z != "Movable")
    print(f"\nhot-added blocks after boot on {kernel.series}: {zone}")
    _rc, report = modstage(node, "status")
    if policy == "offline":
        assert stuck == [], zone  # nothing was online before the policy: nothing to move
    else:
        assert all(zone[b] == "Normal" for b in stuck) and len(stuck) <= 2, zone
    problems = [ln for ln in report.splitlines() if "onlined before the policy was set" in ln]
    if stuck:
        [line] = problems
        named = sorted(w for w in line.split() if w.startswith("memory") and w[6:].isdigit())
        assert named == stuck, (named, report)
    else:
        assert problems == [], report


# 7.2 is built without CONFIG_MODVERSIONS: it compares no symbol CRC, so there is no such
# refusal to name (tests/service/test_modinfo.py proves modstage does not claim one there)
@pytest.mark.kernels("6.1", "6.12")
def test_kernel_refuses_a_symbol_crc_and_boot_names_the_symbol(
    node: Vm,
    release: str,
    kernel: Kernel,
    test_modules: dict[str, Path],
    signed: dict[str, Path],
    key: SigningKey,
    certs: dict[str, bytes],
    tmp_path: Path,
) -> None:
    """Boot leaves symbol CRCs to the kernel: a generation taken in while none of the
    target's exports could be read (vmlinuz and Module.symvers gone,
    ``require_symbol_crcs = false``) whose module imports a symbol under another CRC than
    the running kernel's is refused by finit_module (EINVAL); boot names the symbol from
    the exports, nothing stays loaded and the last good generation returns."""
    from service.layout import Layout
    from service.verify.modfile.modinfo import read_versions
    from service.verify.targetkernel.kernel import Target
    from tests.oracle.elf import flip_version_crc

    config = "require_symbol_crcs = false\n" + CRC8
    drop(node, "test", "1", release, [(signed["crc8"], "")])
    prepare(node, certs, config)
    assert modstage(node, "intake")[0] == 0
    node.reboot()
    assert _boot(node, certs, config)[0] == 0
    good = state(node).bundle("test").active

    probed = Target.from_layout(Layout(kernel.root), release).probe_only().exports
    symbol = next(n for n, _ in read_versions(test_modules["ms_params"]) if n not in probed)
    flipped = tmp_path / "unsigned" / "ms_params.ko"
    flipped.parent.mkdir()
    flipped.write_bytes(flip_version_crc(test_modules["ms_params"].read_bytes(), symbol.encode()))
    signed_flip = kmod.sign(kernel, flipped, key, tmp_path / "ms_params.ko")
    drop(node, "test", "2", release, [(signed_flip, "")])
    symvers = f"/lib/modules/{release}/build/Module.symvers"
    image = f"/boot/vmlinuz-{release}"
    node.run(f"rm {symvers} {image}").check()  # on the guest's overlay: back after the reboot
    assert modstage(node, "intake")[0] == 0  # the CRC could not be checked: taken in
    bad = state(node).bundle("test").pending

    node.reboot()
    assert node.run(f"test -f {symvers} && test -f {image}").rc == 0
    rc, out = _boot(node, certs, config)
    assert rc == 0, out  # active again, on the last known good generation
    b = state(node).bundle("test")
    assert (b.phase, b.active, b.pending) == (Phase.ACTIVE, good, None)
    failed = str(b.generations[str(bad)].failed)
    assert failed.startswith(
        f"modules/ms_params.ko: EINVAL: disagrees about version of symbol {symbol} "
    ), failed
    assert failed.endswith(
        "(finit_module: EINVAL: invalid module or parameter (or a symbol version mismatch))"
    ), failed
    live = live_modules(node)
    assert "crc8" in live and "ms_params" not in live

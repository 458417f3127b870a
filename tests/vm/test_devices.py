"""Kernel truth: the PCI devices a bundle drives, with QEMU's ``edu`` device (1234:11e8).

``ms_pci`` (tests/kmod/src) is a pci_driver whose alias table matches ``edu``; with
``require_device=1`` its init returns ENODEV when it bound nothing, as the NVIDIA driver's
does without a GPU. ``ms_pci_rival`` is another driver for the same device. One node, two
boots: without the device (absent), then with it (bound; taken by the rival first; loaded
while the rival has it; unbound).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tests.kmod import SigningKey, make_key
from tests.vm.harness import Vm, VmFactory, kmod
from tests.vm.harness.kernel import Kernel
from tests.vm.node import drop, live_modules, modstage, prepare, state

pytestmark = pytest.mark.vm


@pytest.fixture(scope="module")
def key(tmp_path_factory: pytest.TempPathFactory) -> SigningKey:
    """The driver vendor's signing key."""
    return make_key(tmp_path_factory.mktemp("vendor-devices"), "rsa4096", cn="vendor key")


def _status(node: Vm) -> tuple[int, dict[str, Any], str]:
    """``status --json`` and the plain view: (exit code, document, text)."""
    rc, out = modstage(node, "status", "--json")
    return rc, json.loads(out), modstage(node, "status")[1]


def _edu(node: Vm) -> str:
    """The address of the node's edu device (its modalias read from sysfs)."""
    found = node.run("grep -l 'pci:v00001234d000011E8' /sys/bus/pci/devices/*/modalias").check()
    return found.stdout.strip().split("/")[-2]


@pytest.mark.kernels("6.1", "6.12")
def test_absent_bound_taken_and_unbound_devices_on_the_real_kernel(
    boot_vm: VmFactory, test_modules: dict[str, Path], key: SigningKey, tmp_path: Path
) -> None:
    """Without the device the real init's ENODEV makes the bundle no_device: no attempt
    counted, nothing failed, no fallback, status healthy saying so. Booted with the device,
    the same generation loads and binds it ("1 of 1 device bound"). With the rival bound
    first, ENODEV again and the reason names the rival; a build that loads without a device
    is active but drives nothing: degraded, naming ms_pci_rival, then "bound to nothing".
    Meanwhile the daemon's uevent listener (pyudev's kernel-source monitor) tells its loop of
    each driver lost and gained (``unbind``, ``bind``, ``unbind``), then of an edu device
    hot-added over QMP (``add``, and the ``bind`` of the loaded ms_pci)."""
    certs = {"vendor.pem": key.cert_pem.read_bytes()}
    node = boot_vm("devices")
    release = node.kernel.release
    pci = kmod.sign(node.kernel, test_modules["ms_pci"], key, tmp_path / "ms_pci.ko")
    rival = node.put(
        kmod.sign(node.kernel, test_modules["ms_pci_rival"], key, tmp_path / "rival.ko"),
        "rival.ko",
    )

    # absent: the VM has no edu device
    drop(node, "edu", "1", release, [(pci, "require_device=1")])
    prepare(node, certs)
    assert modstage(node, "intake")[0] == 0
    assert modstage(node, "boot")[0] == 0
    b = state(node).bundle("edu")
    gen = b.pending
    assert b.phase.value == "no_device" and gen is not None and b.active is None
    assert b.generations[gen].attempts == 0 and b.generations[gen].failed is None
    assert "no device its 1 PCI alias(es) match is present" in b.history[-1].note
    assert "finit_module" in b.history[-1].note and "ms_pci" not in live_modules(node)
    rc, doc, text = _status(node)
    assert rc == 0 and doc["bundles"]["edu"]["phase"] == "no_device", doc["problems"]
    assert "edu: no device was present at boot" in text

    # present: the next boot has the device; the same generation loads and binds it
    node.reboot(devices=["edu"])
    prepare(node, certs)
    address = _edu(node)
    assert modstage(node, "boot")[0] == 0
    b = state(node).bundle("edu")
    assert (b.phase.value, b.active, b.pending) == ("active", gen, None)
    assert node.run(f"readlink /sys/bus/pci/devices/{address}/driver").check().stdout.strip()
    rc, doc, text = _status(node)
    devices = doc["bundles"]["edu"]["devices"]
    assert rc == 0 and (devices["present"], devices["bound"]) == (1, 1), doc["problems"]
    assert devices["devices"][0]["address"] == address
    assert devices["devices"][0]["driver"] == devices["devices"][0]["module"] == "ms_pci"
    assert "edu: 1 of 1 device bound" in text

    # from here on the daemon's uevent listener hears every PCI change (told() returns the
    # device events; the module events it also hears feed the unload record)
    node.python(
        "import queue, time\n"
        "from pathlib import Path\n"
        "from service.daemon.uevents import UeventListener\n"
        "from service.host.sysfs import Sysfs\n"
        "heard = queue.Queue()\n"
        "listener = UeventListener(Sysfs(Path('/sys')), 'kernel', heard)\n"
        "listener.start()\n"
        "def told(want, timeout=60.0):\n"
        "    got, deadline = [], time.monotonic() + timeout\n"
        "    while len(got) < want and time.monotonic() < deadline:\n"
        "        try:\n"
        "            event = heard.get(timeout=0.5)\n"
        "        except queue.Empty:\n"
        "            continue\n"
        "        if event.kind.value != 'devices':\n"
        "            continue  # module add/remove events (the unload record) are not asked here\n"
        "        got.append((event.kind.value, event.detail))\n"
        "    return got\n"
    )

    # taken: another driver binds the device first; the generation's init finds nothing
    assert int(node.eval("delete_module('ms_pci')")) == 0
    assert int(node.eval(f"finit_module({rival!r})")) == 0
    assert modstage(node, "boot")[0] == 0
    b = state(node).bundle("edu")
    assert b.phase.value == "no_device" and b.active == gen
    assert f"bound to another driver: {address} (1234:11e8) to ms_pci_rival" in (b.history[-1].note)

    # a build that loads without a device: active, but the rival drives the device
    drop(node, "edu", "2", release, [(pci, "require_device=0")])
    assert modstage(node, "intake")[0] == 0
    assert modstage(node, "boot")[0] == 0
    assert state(node).bundle("edu").phase.value == "active"
    rc, doc, text = _status(node)
    assert rc == 1 and doc["health"] == "degraded"
    assert doc["bundles"]["edu"]["devices"]["bound"] == 0
    assert f"{address} (1234:11e8) bound to ms_pci_rival" in text
    assert "its modules drive none of its devices" in text

    # unbound: no driver has it
    node.run(f"echo {address} > /sys/bus/pci/drivers/ms_pci_rival/unbind").check()
    rc, doc, text = _status(node)
    assert rc == 1 and f"{address} (1234:11e8) bound to nothing" in text
    assert doc["bundles"]["edu"]["devices"]["devices"][0]["driver"] is None
    try:
        assert node.eval("told(3)") == [
            ["devices", f"unbind {address}"],
            ["devices", f"bind {address}"],
            ["devices", f"unbind {address}"],
        ]
        # a device appears: hot-added, then bound by the loaded ms_pci (require_device=0)
        node.qmp("device_add", driver="edu", id="edu-hot")
        [added, bound] = node.eval("told(2)")
        hot = added[1].removeprefix("add ")
        assert added[0] == "devices" and added[1].startswith("add ") and hot != address
        assert bound == ["devices", f"bind {hot}"]
    finally:
        node.python("listener.stop()")


@pytest.mark.nvidia
@pytest.mark.kernels("6.1", "6.12")
def test_real_nvidia_without_a_gpu_is_no_device_under_signature_enforcement(
    kernel: Kernel, tmp_path: Path, tmp_path_factory: pytest.TempPathFactory
) -> None:
    """Debian's real driver of the kernel's own release (535 on 6.1, 550 on 6.12, built against
    its headers by tests/nvidia): the four modules the GPU operator loads by default
    (``nvidia-peermem`` only comes with RDMA), signed by the kernel's ``sign-file`` with a key
    the kernel has built in, staged with the operator's parameter files and the GSP firmware,
    taken in (every module and firmware file stored as staged) and booted by modstage with
    ``module.sig_enforce`` on: ``nvidia``'s init runs (every loader check passed), prints
    "NVRM: No NVIDIA GPU found." and returns ENODEV; no device matches its aliases, so the
    bundle is no_device, nothing of it loaded, no attempt counted, nothing failed, status is
    healthy saying so, and the container's ``modstage wait`` ends at once with exit 5."""
    import ssl

    from tests.nvidia import MODULE_NAMES, PARAMS, driver_for, sign_driver
    from tests.oracle.pki import ca_kind
    from tests.vm.harness.builtin_key import BuiltinKeyKernel, find_builtin_cert

    # the key takes the place of Debian's in the image: RSA-2048 fits 6.1's slot, P-256 6.12's
    slot = find_builtin_cert(kernel.vmlinux().read_bytes())[1]
    key = make_key(tmp_path / "key", ca_kind(slot), cn="modstage nvidia")
    driver = driver_for(kernel)
    signed = sign_driver(driver, key, tmp_path / "signed", kernel)
    bundle = [(signed[name], "") for name in MODULE_NAMES if name != "nvidia-peermem"]
    params = tmp_path / "drivers"  # the operator's kernelModuleConfig, one file per module
    params.mkdir()
    for name, text in PARAMS.items():
        (params / f"{name}.conf").write_text(text)
    der = ssl.PEM_cert_to_DER_cert(key.cert_pem.read_text())
    builtin = BuiltinKeyKernel.with_cert(der, kernel)
    state_dir = tmp_path_factory.mktemp("nvidia-state")
    node = Vm.boot(state_dir, name=f"nvidia-{kernel.series}", kernel=builtin)
    try:
        # nvidia's in-tree dependency is Debian-signed: its key is no longer built in, so it
        # loads before enforcement is switched on (one way)
        node.run(["modprobe", "-a", "drm"]).check()
        node.run("echo 1 > /sys/module/module/parameters/sig_enforce").check()
        assert node.read("/sys/module/module/parameters/sig_enforce") == "Y"
        options = {"params_dir": params, "firmware_dirs": (driver.firmware,)}
        drop(node, "nvidia", driver.version, node.kernel.release, bundle, **options)
        prepare(node, {"nvidia.pem": key.cert_pem.read_bytes()})
        assert modstage(node, "intake", timeout=600)[0] == 0
        gen = str(state(node).bundle("nvidia").pending)
        stored = node.state_dir / "store" / gen
        for ko, _ in bundle:
            assert (stored / "modules" / ko.name).read_bytes() == ko.read_bytes()
        blobs = [p for p in driver.firmware.rglob("*") if p.is_file()]
        assert blobs and all(
            (stored / "firmware" / blob.relative_to(driver.firmware)).stat().st_size
            == blob.stat().st_size
            for blob in blobs
        )
        assert modstage(node, "boot", timeout=600)[0] == 0
        b = state(node).bundle("nvidia")
        assert b.phase.value == "no_device" and str(b.pending) == gen, b.history[-1].note
        assert b.generations[gen].attempts == 0 and b.generations[gen].failed is None
        note = b.history[-1].note
        assert "no device its" in note and "PCI alias(es) match is present" in note
        assert not {"nvidia", "nvidia_modeset", "nvidia_uvm", "nvidia_drm"} & set(
            live_modules(node)
        )
        assert "NVRM: No NVIDIA GPU found." in node.run("dmesg").check().stdout
        rc, doc, text = _status(node)
        assert rc == 0 and doc["bundles"]["nvidia"]["phase"] == "no_device", doc["problems"]
        assert "nvidia: no device was present at boot" in text
        rc, said = modstage(node, "wait", "--bundle", "nvidia", "--generation", gen)
        assert rc == 5 and f"generation {gen[:12]} was not loaded: " in said, said  # no wait
    finally:
        node.close()

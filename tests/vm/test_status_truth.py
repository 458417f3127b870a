"""``status`` against a real kernel: the record is checked with /sys/module and the boot id,
and a corrupt state.json is rebuilt at boot from the last-good pointer and the store."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.kmod import SigningKey, make_key
from tests.vm.harness import VmFactory, kmod
from tests.vm.harness.kernel import Kernel
from tests.vm.node import drop, live_modules, modstage, prepare, state

pytestmark = [pytest.mark.vm, pytest.mark.kernels("6.1", "6.12")]


@pytest.fixture(scope="module")
def key(tmp_path_factory: pytest.TempPathFactory) -> SigningKey:
    """The driver vendor's signing key."""
    return make_key(tmp_path_factory.mktemp("vendor-status"), "rsa4096", cn="vendor key")


def test_status_checks_the_kernel_and_boot_rebuilds_a_corrupt_state(
    boot_vm: VmFactory,
    kernel: Kernel,
    test_modules: dict[str, Path],
    key: SigningKey,
    tmp_path: Path,
) -> None:
    """Active: status shows the live srcversion, version and refcnt (exit 0). After a reboot
    without modstage boot: failed, the module not live, boot not run (exit 2). With
    state.json garbled, modstage boot loads the last known good again from the store."""
    certs = {"vendor.pem": key.cert_pem.read_bytes()}
    module = kmod.sign(kernel, test_modules["ms_params"], key, tmp_path / "ms_params.ko")
    node = boot_vm("status-truth")
    drop(node, "test", "1", kernel.release, [(module, "count=3")])
    prepare(node, certs)
    assert modstage(node, "intake")[0] == 0
    assert modstage(node, "boot")[0] == 0
    rc, out = modstage(node, "status", "--json")
    doc = json.loads(out)
    loaded = doc["bundles"]["test"]["loaded"][0]
    assert rc == 0 and doc["health"] == "healthy", doc["problems"]
    assert loaded["live"]["srcversion"] == loaded["srcversion"] is not None
    assert loaded["live"]["version"] == "1.0" and loaded["live"]["refcnt"] == 0

    node.reboot()
    prepare(node, certs)
    rc, out = modstage(node, "status")
    assert rc == 2, out
    assert "module(s) ms_params are not loaded in the running kernel" in out
    assert "modstage boot has not run in this boot" in out

    (node.state_dir / "state.json").write_text('{"format": 1, "bund')
    rc, out = modstage(node, "boot")
    assert rc == 0, out
    assert "ms_params" in live_modules(node)
    assert state(node).bundle("test").active is not None
    rc, out = modstage(node, "status", "--json")
    doc = json.loads(out)
    assert rc == 1 and "was rebuilt after it was found corrupt" in doc["problems"][0]["reason"]

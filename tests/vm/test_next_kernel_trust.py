"""The next kernel's trust, judged on a real node before the reboot into it.

A Debian 12 node runs 6.1 with a test certificate as its only built-in key
(``BuiltinKeyKernel``: Debian's build certificate overwritten in the image) and enforces
signatures (``sig_enforce`` switched on after boot, as the oracle's bed does). Debian 13's 6.12
is installed beside it (as ``tests/vm/test_kernel_update.py`` installs it). The same vendor
module, signed by that built-in key, is staged for both kernels:

* for 6.12 that key is the running image's, not 6.12's (whose image carries Debian 13's build
  key alone): intake refuses it before any reboot, naming the signer,
  ``.builtin_trusted_keys``, both kernels and 6.12's image;
* for 6.1 the running kernel's ``.builtin_trusted_keys`` trusts it: taken in.

The keyring reader finds the key in ``.builtin_trusted_keys`` and, through the link, in
``.secondary_trusted_keys``, and in no other keyring.

On a Secure Boot node (OVMF, Debian 12's shim and grub, its signed 6.1; a vendor key enrolled
as a MOK) with 6.12 installed, a drop for 6.12 signed by the MOK is taken in (a MOK is every
kernel's key, and 6.12's config lets MOKs sign), and one signed by a key the node never
enrolled is refused for 6.12, naming no keyring of the running kernel.

Runs under the 6.1 parametrisation.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from service.verify.signature.keyring import signer_key_id
from tests.kmod import SigningKey, make_key
from tests.vm.harness import Vm, exports_cache, kmod
from tests.vm.harness.builtin_key import BuiltinKeyKernel
from tests.vm.harness.kernel import Kernel
from tests.vm.harness.secureboot import SecureBootVm, enroll
from tests.vm.node import drop, modstage, prepare, state
from tests.vm.test_kernel_update import _install

pytestmark = [pytest.mark.vm, pytest.mark.kernels("6.1")]

RUNNING = (
    "__import__('service.verify.signature.keyring', fromlist=['k'])"
    ".KernelKeyring(__import__('pathlib').Path('/proc'))"
)


@pytest.fixture(scope="module")
def key(tmp_path_factory: pytest.TempPathFactory) -> SigningKey:
    """The key built into the running kernel (RSA-2048: it fits the slot of Debian's)."""
    return make_key(tmp_path_factory.mktemp("builtin-vendor"), "rsa2048", cn="built-in vendor")


def test_a_key_only_the_running_kernel_builds_in_is_refused_for_the_next_kernel(
    kernel: Kernel, key: SigningKey, tmp_path: Path
) -> None:
    """The steps of the module docstring, each checked on the node."""
    new = Kernel.named("6.12")
    running = BuiltinKeyKernel.with_cert(key.cert_der.read_bytes(), kernel)
    old_ko = tmp_path / "old" / "ms_exporter.ko"
    new_ko = tmp_path / "new" / "ms_exporter.ko"
    for target, out in ((kernel, old_ko), (new, new_ko)):
        out.parent.mkdir(parents=True)
        kmod.sign(target, kmod.build_modules(target)["ms_exporter"], key, out)
    share = tmp_path / "state"
    exports_cache.seed(share, new)  # what intake would read from 6.12's tree over 9p, minutes
    with Vm(share, name="nextkeys-6.1", kernel=running) as node:
        node.start()
        node.run("echo 1 > /sys/module/module/parameters/sig_enforce").check()
        assert node.read("/sys/module/module/parameters/sig_enforce") == "Y"
        prepare(node, {"vendor.pem": key.cert_pem.read_bytes()})
        _install(node, new)
        key_id = signer_key_id(old_ko)
        assert key_id is not None
        assert sorted(node.eval(f"sorted({RUNNING}.rings({key_id!r}))")) == [
            "builtin",
            "secondary",
        ]

        drop(node, "demo", "1", new.release, [(new_ko, "")])
        rc, said = modstage(node, "intake", timeout=600)  # 6.12's image is read for its keys
        assert state(node).bundle("demo").pending is None, said
        rc, out = modstage(node, "status", "--json")
        errors = json.loads(out)["bundles"]["demo"]["errors"]
        refused = [e for e in errors if "EKEYREJECTED" in e]
        assert len(refused) == 1, (said, errors)
        [reason] = refused
        assert reason.startswith(f"EKEYREJECTED: kernel {new.release} (module.sig_enforce=1")
        assert f"signing key {key_id} (built-in vendor)" in reason
        assert (
            f"only the running kernel {kernel.release}'s .builtin_trusted_keys holds it" in reason
        )
        assert f"/boot/vmlinuz-{new.release} does not carry it" in reason
        assert "mokutil --import /etc/modstage/trusted.d/vendor.pem" in reason

        drop(node, "demo", "2", kernel.release, [(old_ko, "")])
        rc, out = modstage(node, "intake")
        assert rc == 0, out
        assert state(node).bundle("demo").pending is not None


def test_a_mok_signs_for_the_next_kernel_on_a_secure_boot_node(
    kernel: Kernel, tmp_path: Path
) -> None:
    """The Secure Boot part of the module docstring."""
    new = Kernel.named("6.12")
    keys = tmp_path / "keys"
    vendor = make_key(keys, "rsa2048", cn="enrolled vendor")
    stranger = make_key(keys, "rsa2048", cn="stranger vendor")
    built = kmod.build_modules(new)
    enrolled_ko = kmod.sign(new, built["ms_exporter"], vendor, keys / "ms_exporter.ko")
    stranger_ko = kmod.sign(new, built["ms_params"], stranger, keys / "ms_params.ko")
    store = enroll(tmp_path / "vars.fd", mok=[vendor.cert_pem])
    share = tmp_path / "state"
    exports_cache.seed(share, new)
    with SecureBootVm(share, vars_store=store, name="nextkeys-sb-6.1", kernel=kernel) as node:
        node.start()
        assert node.read("/sys/kernel/security/lockdown") == "none [integrity] confidentiality"
        key_id = signer_key_id(enrolled_ko)
        assert key_id is not None
        assert "machine" in node.eval(f"sorted({RUNNING}.rings({key_id!r}))")
        certs = {"vendor.pem": vendor.cert_pem.read_bytes(),
                 "stranger.pem": stranger.cert_pem.read_bytes()}  # fmt: skip
        prepare(node, certs)
        _install(node, new)
        drop(node, "enrolled", "1", new.release, [(enrolled_ko, "")])
        drop(node, "stranger", "1", new.release, [(stranger_ko, "")])
        said = modstage(node, "intake", timeout=900)[1]  # 6.12's files read over 9p
        generation = state(node).bundle("enrolled").pending
        assert generation is not None, said
        assert state(node).bundle("enrolled").generations[generation].kernel == new.release
        assert state(node).bundle("stranger").pending is None, said
        out = modstage(node, "status", "--json")[1]
        errors = json.loads(out)["bundles"]["stranger"]["errors"]
        refused = [e for e in errors if "EKEYREJECTED" in e]
        assert len(refused) == 1, (said, errors)
        assert refused[0].startswith(
            f"EKEYREJECTED: kernel {new.release} (module.sig_enforce=1 on the running"
        )
        assert "(stranger vendor): no keyring of the running kernel" in refused[0]
        assert f"/boot/vmlinuz-{new.release} does not carry it" in refused[0]

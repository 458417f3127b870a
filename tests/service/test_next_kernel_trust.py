"""A drop for a kernel that is installed but not running is judged, before the reboot into
it, against the keys every kernel on the host shares (MOK, db, dbx) and that kernel's own
built-in certificates; a signer only the running kernel's built-in keyring holds is named.

The host below runs another kernel (:data:`RUNNING`); the test modules' kernel, with Debian's
real configuration (``INTEGRITY_MACHINE_KEYRING`` and ``INTEGRITY_PLATFORM_KEYRING`` both
``y``), is the one installed beside it. The keyring answers as the running kernel's would
(:class:`~tests.service.fakes.FakeKeyring`): what it holds in which keyring.
"""

from __future__ import annotations

import hashlib
import struct
from pathlib import Path

import pytest
from cryptography import x509
from cryptography.x509.oid import ExtensionOID

from service.layout import Layout, kernel_config, kernel_image
from service.verify.signature.keyring import signer_key_id
from service.verify.targetkernel.rules import KernelRules
from stager.drop import ModuleSpec, stage
from tests.hosts import KEEP, running_host
from tests.kmod import SigningKey, make_key, sign
from tests.service.conftest import HostTree
from tests.service.fakes import FakeKeyring, make_intake
from tests.vm.harness.builtin_key import find_builtin_cert
from tests.vm.harness.kernel import Kernel

RUNNING = "6.0.0-99-amd64"  # the running kernel: not the drop's


@pytest.fixture
def host(host_tree: HostTree) -> Layout:
    """An enforcing host running :data:`RUNNING`, with the test modules' kernel installed."""
    return running_host(host_tree(enforcing=True), RUNNING, KEEP)


@pytest.fixture
def module(modules: dict[str, Path], rsa_key: SigningKey, tmp_path: Path) -> Path:
    """ms_params signed with the key the host's trusted.d holds."""
    return sign(modules["ms_params"], rsa_key, tmp_path / "ms_params.ko")


def take(
    host: Layout, kernel: str, module: Path, keyring: FakeKeyring, version: str = "1"
) -> tuple[str, ...]:
    """The reasons intake refuses a drop of ``module`` for ``kernel`` (empty: taken in)."""
    specs = [ModuleSpec(module, "")]
    stage(host.incoming, bundle="p", version=version, kernel=kernel, modules=specs)
    [outcome] = make_intake(host, keyring=keyring).run()
    return outcome.reasons


def configure(host: Layout, kernel: str, lines: str) -> None:
    """Later lines of the target's config win (Debian's real one is read first)."""
    config = kernel_config(host, kernel)
    config.write_text(config.read_text() + lines)


def test_a_mok_signs_for_the_next_kernel_where_its_config_lets_one(
    host: Layout, kernel: str, module: Path
) -> None:
    """A MOK (``.machine``) is the next kernel's key too: taken in while the target is built
    with ``INTEGRITY_MACHINE_KEYRING`` or the ``.platform`` fallback; refused for one built
    with neither (or whose ``.machine`` takes CAs only), naming the keyring, the kernel and
    its config."""
    key_id = signer_key_id(module)
    assert key_id is not None
    assert take(host, kernel, module, FakeKeyring({key_id})) == ()
    configure(host, kernel, "CONFIG_INTEGRITY_PLATFORM_KEYRING=n\n")
    assert take(host, kernel, module, FakeKeyring({key_id}), "2") == ()
    configure(host, kernel, "CONFIG_INTEGRITY_CA_MACHINE_KEYRING=y\n")  # .machine: CAs only
    assert take(host, kernel, module, FakeKeyring({key_id}), "3")
    configure(host, kernel, "CONFIG_INTEGRITY_MACHINE_KEYRING=n\n")
    [reason] = take(host, kernel, module, FakeKeyring({key_id}), "4")
    assert reason.startswith(f"EKEYREJECTED: kernel {kernel} (module.sig_enforce=1 on the running")
    assert f"signing key {key_id} " in reason
    assert "the running kernel's .machine (MOK) holds it" in reason
    assert "CONFIG_INTEGRITY_MACHINE_KEYRING" in reason


def test_a_db_key_signs_for_the_next_kernel_only_with_the_platform_fallback(
    host: Layout, kernel: str, module: Path
) -> None:
    """A UEFI db key (``.platform``) counts for the next kernel through Debian's fallback
    (``INTEGRITY_PLATFORM_KEYRING``) and not without it."""
    key_id = signer_key_id(module)
    assert key_id is not None
    assert take(host, kernel, module, FakeKeyring(set(), platform={key_id})) == ()
    configure(host, kernel, "CONFIG_INTEGRITY_PLATFORM_KEYRING=n\n")
    [reason] = take(host, kernel, module, FakeKeyring(set(), platform={key_id}), "2")
    assert "the running kernel's .platform (UEFI db) holds it" in reason
    assert f"kernel {kernel} " in reason


def test_a_signer_only_the_running_kernels_builtin_keyring_holds_is_named(
    host: Layout, kernel: str, module: Path
) -> None:
    """A key of the running kernel's ``.builtin_trusted_keys`` is that image's own: for the
    next kernel, whose image cannot be read here, the drop is refused naming the signer, the
    keyring, both kernels and the remedy (enroll the certificate trusted.d holds as a MOK);
    a key the running kernel added to ``.secondary_trusted_keys`` at run time is refused
    likewise."""
    key_id = signer_key_id(module)
    assert key_id is not None
    [reason] = take(host, kernel, module, FakeKeyring(set(), builtin={key_id}))
    assert f"kernel {kernel} (module.sig_enforce=1" in reason
    assert f"signing key {key_id} (" in reason
    assert f"only the running kernel {RUNNING}'s .builtin_trusted_keys holds it" in reason
    assert f"the certificates built into {kernel} are unknown" in reason
    assert "enroll it as a MOK: mokutil --import " in reason and ".pem" in reason
    [reason] = take(host, kernel, module, FakeKeyring(set(), secondary={key_id}), "2")
    assert f"only the running kernel {RUNNING}'s .secondary_trusted_keys holds it" in reason


@pytest.fixture(scope="module")
def builtin_key(tmp_path_factory: pytest.TempPathFactory) -> SigningKey:
    """An RSA-2048 key, small enough for the slot of Debian's built-in certificate."""
    return make_key(tmp_path_factory.mktemp("builtin"), "rsa2048", cn="modstage built-in")


def carrying(vmlinux: bytes, der: bytes) -> bytes:
    """``vmlinux`` whose built-in certificate list is ``der`` alone: Debian's certificate
    overwritten, the list's two lengths written after it at the next 8-byte boundary, as
    ``certs/system_certificates.S`` lays a list out."""
    start, length = find_builtin_cert(vmlinux)
    assert len(der) + 24 <= length, "the test certificate does not fit the slot"
    quad = (start + len(der) + 7) & ~7
    lengths = struct.pack("<QQ", len(der), len(der))
    slot = der + b"\0" * (quad - start - len(der)) + lengths
    return vmlinux[:start] + slot + b"\0" * (length - len(slot)) + vmlinux[start + length :]


def test_the_next_kernels_own_image_decides_for_a_builtin_key(
    host_tree: HostTree, kernel: str, modules: dict[str, Path], builtin_key: SigningKey,
    tmp_path: Path,
) -> None:  # fmt: skip
    """Whether the next kernel trusts a key is read from its own image: with Debian's image
    (its build key alone) a key the running kernel holds built in is refused, naming the
    image that does not carry it; with an image whose built-in list is that certificate the
    same drop is taken in, and so is one whose key no keyring of the running kernel holds."""
    real = Kernel.find()
    if real.release != kernel:
        pytest.skip(f"the test modules' kernel {kernel} is not this machine's {real.release}")
    host = running_host(host_tree(enforcing=True), RUNNING, KEEP)
    (host.trusted / "builtin.pem").write_bytes(builtin_key.cert_pem.read_bytes())
    signed = sign(modules["ms_params"], builtin_key, tmp_path / "ms_params.ko")
    key_id = signer_key_id(signed)
    assert key_id is not None
    image = kernel_image(host, kernel)
    vmlinux = real.vmlinux().read_bytes()
    image.write_bytes(vmlinux)
    [reason] = take(host, kernel, signed, FakeKeyring(set(), builtin={key_id}))
    assert f"only the running kernel {RUNNING}'s .builtin_trusted_keys holds it" in reason
    assert f"and {image} does not carry it" in reason
    image.write_bytes(carrying(vmlinux, builtin_key.cert_der.read_bytes()))
    assert take(host, kernel, signed, FakeKeyring(set(), builtin={key_id}), "2") == ()
    assert take(host, kernel, signed, FakeKeyring(set()), "3") == ()


def test_dbx_refuses_for_the_next_kernel(host: Layout, kernel: str, module: Path) -> None:
    """A module whose hash ``.blacklist`` (dbx) lists is refused for the next kernel too,
    even with a MOK signer."""
    key_id = signer_key_id(module)
    assert key_id is not None
    digest = hashlib.sha256(module.read_bytes()).hexdigest()
    [reason] = take(host, kernel, module, FakeKeyring({key_id}, blacklist={digest}))
    assert reason.endswith(f"module hash {digest} is in .blacklist")


def test_the_next_kernel_enforces_by_its_config_or_as_the_running_one(
    host_tree: HostTree, kernel: str, module: Path
) -> None:
    """Without enforcement on the running kernel nor in the target's config, nothing is asked
    of the keyrings; ``CONFIG_MODULE_SIG_FORCE`` in the target's config makes it enforce,
    and the refusal says so."""
    host = running_host(host_tree(enforcing=False), RUNNING, KEEP)
    key_id = signer_key_id(module)
    assert take(host, kernel, module, FakeKeyring(set(), builtin={str(key_id)})) == ()
    configure(host, kernel, "CONFIG_MODULE_SIG_FORCE=y\n")
    [reason] = take(host, kernel, module, FakeKeyring(set(), builtin={str(key_id)}), "2")
    assert f"kernel {kernel} (CONFIG_MODULE_SIG_FORCE in {kernel_config(host, kernel)})" in reason


def test_trusted_d_still_decides_first(
    host: Layout, kernel: str, modules: dict[str, Path], other_key: SigningKey, tmp_path: Path
) -> None:
    """modstage's own trust list applies to a next-kernel drop as to any: a signer the host's
    trusted.d does not hold is refused even when a MOK of the node holds it."""
    signed = sign(modules["ms_params"], other_key, tmp_path / "other.ko")
    key_id = signer_key_id(signed)
    assert key_id is not None
    reasons = take(host, kernel, signed, FakeKeyring({key_id}))
    assert reasons and not any("EKEYREJECTED: kernel" in r for r in reasons), reasons


def test_a_builtin_certificate_the_next_kernels_parser_refuses_trusts_nothing(
    kernel: str, tmp_path: Path
) -> None:
    """A built-in certificate with a malformed keyUsage is loaded by a 6.1 kernel and not by
    a 6.12 one (its X.509 parser refuses it from 6.4 on), so its key ids count for the first
    only."""
    from service.verify.signature.nextkeys import image_key_ids
    from service.verify.signature.trust import TrustedKey
    from tests.service.test_x509_key_usage import BAD_KEY_USAGE, self_signed

    real = Kernel.find()
    if real.release != kernel:
        pytest.skip(f"the test modules' kernel {kernel} is not this machine's {real.release}")
    der = self_signed(20, x509.UnrecognizedExtension(ExtensionOID.KEY_USAGE, BAD_KEY_USAGE))
    image = tmp_path / "vmlinux"
    image.write_bytes(carrying(real.vmlinux().read_bytes(), der))
    ids = {k.hex() for k in TrustedKey.from_der(der, "test").key_ids}
    assert image_key_ids(image, KernelRules.parser((6, 1))) == (frozenset(ids), None)
    assert image_key_ids(image, KernelRules.parser((6, 12))) == (frozenset(), None)

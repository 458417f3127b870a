"""Secure Boot as hosts run it: shim, MOK, db and dbx, lockdown, judged by the kernel.

The node boots through OVMF with Secure Boot on, Debian's signed shim and grub and Debian's
signed 6.1 (tests/vm/harness/secureboot.py); nothing in the kernel is patched. The oracle's
CA is trusted the way hosts trust DKMS keys: enrolled as a MOK (the kernel files it in
`.machine`, linked into `.secondary_trusted_keys`) in one boot, in the UEFI db (`.platform`,
Debian's fallback for modules) in another. Each boot judges the oracle's corpus by
finit_module (one batch) and by `modstage verify`, and checks what the kernel's `.blacklist`
(dbx) refuses against what modstage's pre-flight (service/verify/keyring.py, asked in the
guest) says.
"""

from __future__ import annotations

import errno
import hashlib
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import rsa

from tests.oracle.cases import SEED, generate
from tests.oracle.judge import (
    M_ACCEPT_K_REFUSE,
    compare,
    modstage_verdicts,
    problems,
    table,
    target_root,
    write_cases,
)
from tests.oracle.module import base_module, renamed
from tests.oracle.pki import Cred, Pki, load_pki
from tests.oracle.target_kernel import use
from tests.oracle.testbed import DIGEST_MODULES, OracleVm, sign_file
from tests.vm.harness.kernel import Kernel
from tests.vm.harness.secureboot import SecureBootVm, enroll
from tests.vm.test_oracle import kernel_verdicts

pytestmark = [pytest.mark.vm, pytest.mark.kernels("6.1")]

RUNNING = "__import__('service.verify.keyring', fromlist=['k']).KernelKeyring(__import__('pathlib').Path('/proc'))"


@dataclass
class Node:
    """A prepared Secure Boot node, the credentials it was enrolled with and its extras."""

    where: str  # "mok" or "db": where the CA was enrolled
    oracle: OracleVm
    pki: Pki
    trusted: Path  # modstage's trusted directory: exactly what the kernel was given
    blocked: Path  # a CA-signed module whose sha256 is in dbx
    sibling: Path  # the same module renamed (another hash): not in dbx
    revoked: Path  # a module signed by a certificate enrolled both as a MOK and in dbx
    revoked_key_id: str
    ca_key_id: str
    root: Path  # the minimal target root modstage verifies against
    release: str
    boot_seconds: float


def _self_signed(directory: Path, cn: str) -> Cred:
    """An RSA-2048 self-signed certificate (openssl), as DKMS makes its MOK key."""
    key, cert = directory / f"{cn}.key", directory / f"{cn}.pem"
    subprocess.run(
        ["openssl", "req", "-new", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "36500",
         "-subj", f"/CN={cn}", "-keyout", str(key), "-out", str(cert), "-outform", "PEM",
         "-addext", "extendedKeyUsage=codeSigning"],
        check=True, capture_output=True,
    )  # fmt: skip
    private = serialization.load_pem_private_key(key.read_bytes(), None)
    assert isinstance(private, rsa.RSAPrivateKey)
    return Cred(cn, private, x509.load_pem_x509_certificate(cert.read_bytes()), key, cert)


def _key_id(module: Path, root: Path, release: str, trusted: Path) -> str:
    """The signing key id modstage reads from a module's signature."""
    verdict = modstage_verdicts([module], root, trusted, release)[str(module.resolve())]
    return str(verdict["key_id"])


def _prepare(kernel: Kernel, tmp: Path, where: str) -> Iterator[Node]:
    """Enroll the CA as `where` ("mok" or "db"), plus a MOK+dbx certificate and a dbx module
    hash on the MOK node; boot; add the secondary leaves; yield the node."""
    use(kernel)
    pki = load_pki("rsa2048")
    keys = tmp / "keys"
    keys.mkdir()
    revoked_cred = _self_signed(keys, "modstage revoked MOK")
    rcert = revoked_cred.pem_cert
    base = base_module()
    blocked = tmp / "blocked.ko"
    sign_file(renamed(base, 90101), pki.ca, blocked)
    sibling = tmp / "sibling.ko"
    sign_file(renamed(base, 90102), pki.ca, sibling)
    revoked = tmp / "revoked.ko"
    sign_file(renamed(base, 90103), revoked_cred, revoked)
    store = tmp / "vars.fd"
    if where == "mok":
        digest = hashlib.sha256(blocked.read_bytes()).hexdigest()
        enroll(store, mok=[pki.ca.pem_cert, rcert], dbx=[rcert], dbx_hashes=[digest])
    else:
        enroll(store, db=[pki.ca.pem_cert])
    vm = SecureBootVm.boot(tmp / "state", vars_store=store, name=f"secureboot-{where}")
    try:
        vm.run(["modprobe", "-a", *DIGEST_MODULES]).check()
        oracle = OracleVm(vm, {})
        for cred in pki.secondary():
            path = vm.put(cred.pem_cert, f"keys/{cred.name}.pem")
            oracle.added[cred.name] = oracle.guest(
                f"add_certificate(__import__('ssl').PEM_cert_to_DER_cert(open({path!r}).read()))"
            )
        trusted = tmp / "trusted"
        trusted.mkdir()
        for cred in (pki.ca, *(c for c in pki.secondary() if oracle.added[c.name] > 0)):
            (trusted / f"{cred.name}.pem").write_bytes(cred.pem_cert.read_bytes())
        release = vm.run("uname -r").check().stdout.strip()
        root = target_root(tmp / "root", release)
        revoked_trusted = keys / "trusted"
        revoked_trusted.mkdir()
        (revoked_trusted / "r.pem").write_bytes(rcert.read_bytes())
        key_id = _key_id(revoked, root, release, revoked_trusted)
        ca_id = _key_id(sibling, root, release, trusted)
        print(f"\nSecure Boot node ({where}) booted in {vm.boot_seconds:.1f} s")
        yield Node(
            where, oracle, pki, trusted, blocked, sibling, revoked, key_id, ca_id, root,
            release, vm.boot_seconds,
        )  # fmt: skip
    finally:
        vm.close()


@pytest.fixture(scope="module", params=["mok", "db"])
def node(
    request: pytest.FixtureRequest, kernel: Kernel, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Node]:
    """One Secure Boot node per enrollment (the CA as a MOK, then in db), shared by the tests."""
    yield from _prepare(kernel, tmp_path_factory.mktemp(f"sb-{request.param}"), request.param)


def _load(node: Node, module: Path) -> int:
    vm = node.oracle.vm
    return int(node.oracle.guest(f"finit({vm.put(module, 'proof/' + module.name)!r})"))


def test_node_runs_locked_down_with_the_ca_where_enrolled(node: Node) -> None:
    """Secure Boot is on, the kernel is locked down (integrity) and enforces signatures; the
    CA is in `.machine` when enrolled as a MOK and in `.platform` when in db, and modstage's
    keyring reader (what intake's pre-flight asks) finds it exactly there: through the
    system keyrings for a MOK, only with the `.platform` fallback for db."""
    vm = node.oracle.vm
    assert vm.read("/sys/kernel/security/lockdown") == "none [integrity] confidentiality"
    assert vm.read("/sys/module/module/parameters/sig_enforce") == "Y"
    assert "Secure boot enabled" in vm.run("dmesg").stdout
    keyring = ".machine" if node.where == "mok" else ".platform"
    names = node.oracle.guest(f"keyring_keys({keyring!r})")
    assert any("modstage oracle CA" in key for key in names), names
    system = node.oracle.vm.eval(f"{RUNNING}.trusts({node.ca_key_id!r})")
    fallback = node.oracle.vm.eval(f"{RUNNING}.trusts({node.ca_key_id!r}, platform=True)")
    assert (system, fallback) == (node.where == "mok", True)


def test_corpus_kernel_judges_modstage(
    node: Node, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The oracle's whole corpus (>= 300 seeded cases) judged by `modstage verify` (trusting
    exactly what the node's kernel was given: the CA and the leaves the kernel let into
    `.secondary_trusted_keys`) and by finit_module in one batch: no case modstage accepts is
    refused by the kernel, no refusal is unnamed, every errno modstage claims is the
    kernel's, and the baseline CA-signed module loads."""
    began = time.monotonic()
    cases = generate(node.pki, tmp_path / "gen", SEED)
    assert len(cases) >= 300
    paths = write_cases(cases, node.oracle.vm.state_dir / "cases")
    modstage = modstage_verdicts(list(paths.values()), node.root, node.trusted, node.release)
    judged = time.monotonic()
    kernel = kernel_verdicts(node.oracle, cases, paths)
    outcomes = compare(cases, paths, modstage, kernel)
    found = problems(outcomes)
    timing = (
        f"{len(cases)} cases on the Secure Boot node ({node.where}): modstage "
        f"{judged - began:.1f} s, kernel {time.monotonic() - judged:.1f} s"
    )
    with capsys.disabled():
        print(f"\n{timing}\n{table(outcomes)}")
    assert kernel["baseline/ca-sha256-issuer"]["errno"] == 0
    assert not [o.case for o in outcomes if o.verdict == M_ACCEPT_K_REFUSE]
    assert not found, "\n".join(found)


def test_dbx_module_hash_is_refused_by_both(node: Node) -> None:
    """A CA-signed module whose sha256 the node's dbx holds (MOK node) is refused by the
    kernel (EKEYREJECTED, `.blacklist`) and reported blacklisted by modstage's keyring
    reader; its sibling (same code, another name) loads. On the db node, whose dbx lacks the
    hash, both accept it."""
    digest = hashlib.sha256(node.blocked.read_bytes()).hexdigest()
    listed = node.oracle.vm.eval(f"{RUNNING}.blacklisted({digest!r})")
    loaded = _load(node, node.blocked)
    assert _load(node, node.sibling) == 0
    if node.where == "mok":
        assert (listed, loaded) == (True, errno.EKEYREJECTED)
    else:
        assert (listed, loaded) == (False, 0)


def test_dbx_certificate_verdicts_agree(node: Node) -> None:
    """A module signed by a certificate that is both a MOK and in dbx (MOK node), or not
    enrolled at all (db node): the kernel loads it exactly when modstage's keyring reader
    says the running kernel trusts its signer (with the `.platform` fallback). Kernel fact:
    an X.509 certificate in dbx revokes nothing on a kernel without
    CONFIG_SYSTEM_REVOCATION_LIST (Debian's 6.1: `add_key_to_revocation_list` is a stub), so
    the MOK still loads; only hashes in dbx (`.blacklist`) refuse."""
    trusted = node.oracle.vm.eval(f"{RUNNING}.trusts({node.revoked_key_id!r}, platform=True)")
    loaded = _load(node, node.revoked)
    print(f"\n{node.where}: dbx+MOK-signed module errno {loaded}, pre-flight trusts {trusted}")
    assert (loaded == 0) == trusted
    config = Path(f"/boot/config-{node.release}").read_text()
    revocation = "CONFIG_SYSTEM_REVOCATION_LIST=y" in config
    expected = 0 if node.where == "mok" and not revocation else errno.EKEYREJECTED
    assert loaded == expected

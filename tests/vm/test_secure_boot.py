"""Secure Boot as hosts run it: shim, MOK, db and dbx, lockdown, judged by the kernel.

The node boots through OVMF with Secure Boot on, and the kernel's own Debian release's signed
shim and grub: Debian 12's for Debian 12's signed 6.1, Debian 13's for Debian 13's signed 6.12
(tests/vm/harness/secureboot.py, loaders.py); nothing in the kernel is patched. The oracle's
CA is trusted the way hosts trust DKMS keys: enrolled as a MOK (the kernel files it in
`.machine`, linked into `.secondary_trusted_keys`) in one boot, in the UEFI db (`.platform`,
Debian's fallback for modules) in another. Each boot judges the oracle's corpus by
finit_module (one batch) and by `modstage verify`, and checks what the kernel's `.blacklist`
(dbx) refuses against what modstage's pre-flight (service/verify/signature/keyring.py, asked in the
guest) says.
"""

from __future__ import annotations

import errno
import hashlib
import json
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import rsa

from service.verify.signature.trust import TrustStore
from service.verify.verdict import verify_module
from tests.oracle.cases import CATEGORIES, SEED, generate
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
from tests.vm.harness.kernel import AUTO_ONLINE_AT_BOOT, Kernel
from tests.vm.harness.secureboot import SecureBootVm, enroll
from tests.vm.node import drop, live_modules, modstage, prepare, state
from tests.vm.test_oracle import kernel_verdicts

pytestmark = [pytest.mark.vm, pytest.mark.kernels("6.1", "6.12", "7.2")]

# the time budget: the whole corpus runs on both nodes of 6.1 and on the MOK node of 6.12
# (`.machine`, where DKMS keys land); 6.12's db node judges the categories whose verdicts
# depend on where the signer is enrolled (baseline, ecdsa, keys, signers: 136 cases)
WHOLE_CORPUS = {"6.1": ("mok", "db"), "6.12": ("mok",), "7.2": ("mok",)}
ENROLLMENT = CATEGORIES[:4]
MEMORY = "/sys/devices/system/memory"
RUNNING = "__import__('service.verify.signature.keyring', fromlist=['k']).KernelKeyring(__import__('pathlib').Path('/proc'))"


@dataclass
class Node:
    """A prepared Secure Boot node, the credentials it was enrolled with and its extras."""

    where: str  # "mok" or "db": where the CA was enrolled
    kernel: Kernel
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


def _key_id(module: Path, release: str) -> str:
    """The signing key id modstage's verifier reads from a module's signature (trusting
    nothing: the id comes from the signature; no target files are read)."""
    with open(module, "rb") as f:
        verdict = verify_module(f, display=module.name, trust=TrustStore.from_der(), kernel=release)
    assert verdict.key_id, verdict
    return verdict.key_id


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
    name = f"secureboot-{where}-{kernel.series}"
    vm = SecureBootVm.boot(tmp / "state", vars_store=store, kernel=kernel, name=name)
    try:
        if kernel.series in DIGEST_MODULES:  # built in on 6.12
            vm.run(["modprobe", "-a", *DIGEST_MODULES[kernel.series]]).check()
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
        key_id, ca_id = _key_id(revoked, release), _key_id(sibling, release)
        print(f"\nSecure Boot node ({where}, {kernel.series}) booted in {vm.boot_seconds:.1f} s")
        yield Node(
            where, kernel, oracle, pki, trusted, blocked, sibling, revoked, key_id, ca_id, root,
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
    """The oracle's whole corpus (>= 300 seeded cases; on 6.12's db node its enrollment
    categories, >= 100: WHOLE_CORPUS) judged by `modstage verify` (trusting exactly what the
    node's kernel was given: the CA and the leaves the kernel let into
    `.secondary_trusted_keys`) and by finit_module in one batch: no case modstage accepts is
    refused by the kernel, no refusal is unnamed, every errno modstage claims is the
    kernel's, and the baseline CA-signed module loads."""
    began = time.monotonic()
    whole = node.where in WHOLE_CORPUS[node.kernel.series]
    cases = generate(node.pki, tmp_path / "gen", SEED, CATEGORIES if whole else ENROLLMENT)
    assert len(cases) >= (300 if whole else 100)
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
    """A CA-signed module whose sha256 the node's dbx holds (MOK node) is reported
    blacklisted by modstage's keyring reader and refused by Debian's 6.1 and 6.12
    (EKEYREJECTED, `.blacklist`: a Debian patch); 7.2 loads it (Debian dropped the patch in
    6.17), which is why intake's pre-flight refuses it there as a named policy
    (the `hash_denylist` row of `service.verify.targetkernel.rules.ROWS`). Its sibling (same code, another
    name) loads. On the db node, whose dbx lacks the hash, both accept it."""
    digest = hashlib.sha256(node.blocked.read_bytes()).hexdigest()
    listed = node.oracle.vm.eval(f"{RUNNING}.blacklisted({digest!r})")
    loaded = _load(node, node.blocked)
    assert _load(node, node.sibling) == 0
    if node.where == "mok":
        refused = errno.EKEYREJECTED if node.kernel.series != "7.2" else 0
        assert (listed, loaded) == (True, refused)
    else:
        assert (listed, loaded) == (False, 0)


def test_dbx_certificate_verdicts_agree(node: Node) -> None:
    """A module signed by a certificate that is both a MOK and in dbx (MOK node), or not
    enrolled at all (db node): the kernel loads it exactly when modstage's keyring reader
    says the running kernel trusts its signer (with the `.platform` fallback). Kernel fact:
    an X.509 certificate in dbx revokes nothing on a kernel without
    CONFIG_SYSTEM_REVOCATION_LIST (`add_key_to_revocation_list` is a stub), so the MOK still
    loads; only hashes in dbx (`.blacklist`) refuse. Neither Debian 12's 6.1 nor Debian 13's
    6.12 sets it (both configs: "# CONFIG_SYSTEM_REVOCATION_LIST is not set"); the expectation
    follows the booted kernel's config, so a kernel that sets it must refuse the module."""
    trusted = node.oracle.vm.eval(f"{RUNNING}.trusts({node.revoked_key_id!r}, platform=True)")
    loaded = _load(node, node.revoked)
    print(f"\n{node.where}: dbx+MOK-signed module errno {loaded}, pre-flight trusts {trusted}")
    assert (loaded == 0) == trusted
    config = node.kernel.config.read_text()
    revocation = "CONFIG_SYSTEM_REVOCATION_LIST=y" in config
    expected = 0 if node.where == "mok" and not revocation else errno.EKEYREJECTED
    assert loaded == expected


def test_intake_preflight_status_and_boot_under_lockdown(
    node: Node, test_modules: dict[str, Path], tmp_path: Path
) -> None:
    """On the Secure Boot node, modstage trusting both the enrolled CA and a vendor key that
    is not enrolled: intake refuses the vendor's bundle before any reboot, naming the key, the
    signer and the remedy (`mokutil --import` of the certificate modstage trusts), and
    accepts the CA's; `status --json` names the keyring that holds each module's signer
    (`machine` for a MOK, `platform` for db). Then `modstage boot` under lockdown loads the
    pending generation in order with its parameters and firmware, and onlines hot-added
    memory as Movable. 6.12 boots with `auto_online_blocks` `online`
    (CONFIG_MHP_DEFAULT_ONLINE_TYPE_ONLINE_AUTO=y: the kernel itself would online the DIMM
    in ZONE_NORMAL; modstage moving such blocks is test_memory_hotplug.py's), so there the
    node is first set to `offline`, as modstage's daemon leaves it, and boot's onlining is
    judged on both kernels from the same start."""
    vm = node.oracle.vm
    vendor = _self_signed(tmp_path, "modstage unenrolled vendor")
    signed = {}
    for name in ("ms_exporter", "ms_consumer", "ms_params", "ms_firmware"):
        signed[name] = tmp_path / f"{name}.ko"
        sign_file(test_modules[name].read_bytes(), node.pki.ca, signed[name])
    stranger = tmp_path / "msorc_90105.ko"
    sign_file(renamed(base_module(), 90105), vendor, stranger)
    fw = tmp_path / "fw" / "modstage"
    fw.mkdir(parents=True)
    (fw / "test.bin").write_bytes(b"f" * 4321)
    modules = [
        (signed["ms_exporter"], ""),
        (signed["ms_consumer"], ""),
        (signed["ms_params"], 'count=42 label="two words"'),
        (signed["ms_firmware"], ""),
    ]
    drop(vm, "enrolled", "1", node.release, modules, firmware_dirs=(tmp_path / "fw",),
         memory="online_movable")  # fmt: skip
    drop(vm, "unenrolled", "1", node.release, [(stranger, "")])
    certs = {
        "ca.pem": node.pki.ca.pem_cert.read_bytes(),
        "vendor.pem": vendor.pem_cert.read_bytes(),
    }
    prepare(vm, certs)
    modstage(vm, "intake")
    assert state(vm).bundle("enrolled").pending is not None
    assert state(vm).bundle("unenrolled").pending is None
    rc, out = modstage(vm, "status", "--json")
    doc = json.loads(out)
    [reason] = [e for e in doc["bundles"]["unenrolled"]["errors"] if "EKEYREJECTED" in e]
    assert "does not trust signing key" in reason and "(modstage unenrolled vendor)" in reason
    assert "enroll it as a MOK: mokutil --import /etc/modstage/trusted.d/vendor.pem" in reason
    where = "machine" if node.where == "mok" else "platform"
    signers = doc["bundles"]["enrolled"]["signers"]
    assert [s["keyring"] for s in signers] == [where] * 4, signers

    assert vm.read(f"{MEMORY}/auto_online_blocks") == AUTO_ONLINE_AT_BOOT[node.kernel.series]
    vm.eval(f"write({MEMORY + '/auto_online_blocks'!r}, 'offline')")
    before = set(vm.eval("sorted(os.listdir('/sys/devices/system/memory'))"))
    vm.hotplug_memory("512M")
    added: list[str] = []
    for _ in range(100):
        added = sorted(set(vm.eval("sorted(os.listdir('/sys/devices/system/memory'))")) - before)
        if len(added) == 4:
            break
        vm.eval("__import__('time').sleep(0.1) or 0")
    assert len(added) == 4, added
    rc, out = modstage(vm, "boot")
    assert rc == 0, out
    b = state(vm).bundle("enrolled")
    assert b.active is not None and b.pending is None
    live = live_modules(vm)
    assert live.index("ms_firmware") < live.index("ms_params") < live.index("ms_exporter")
    assert vm.read("/sys/module/ms_params/parameters/count") == "42"
    assert vm.read("/sys/module/ms_params/parameters/label") == "two words"
    assert vm.read("/sys/module/ms_firmware/parameters/fw_size") == "4321"
    for block in added:
        assert vm.read(f"/sys/devices/system/memory/{block}/state") == "online"
        assert vm.read(f"/sys/devices/system/memory/{block}/valid_zones") == "Movable"
    assert vm.read("/sys/kernel/security/lockdown") == "none [integrity] confidentiality"


KEXEC = """
import ctypes, os
_libc = ctypes.CDLL(None, use_errno=True)
def kexec_file(image):
    fd = os.open(image, os.O_RDONLY)
    try:
        rc = _libc.syscall(320, fd, -1, 1, b"\\0", 0x4)  # KEXEC_FILE_NO_INITRAMFS
        return 0 if rc == 0 else ctypes.get_errno()
    finally:
        os.close(fd)
def kexec_plain():
    rc = _libc.syscall(246, 0, 0, 0, 0)  # kexec_load(entry, nr_segments=0, ...)
    return 0 if rc == 0 else ctypes.get_errno()
"""


def _strip_authenticode(image: bytes) -> bytes:
    """The PE image with its certificate table directory entry zeroed (unsigned)."""
    pe = int.from_bytes(image[0x3C:0x40], "little")
    optional = pe + 24
    magic = int.from_bytes(image[optional : optional + 2], "little")
    entry = optional + (112 if magic == 0x20B else 96) + 4 * 8
    return image[:entry] + bytes(8) + image[entry + 8 :]


def test_kexec_under_lockdown_is_judged_as_the_backend_says(node: Node, tmp_path: Path) -> None:
    """Under Secure Boot the kernel refuses plain kexec_load (EACCES: the IMA architecture
    policy of a Secure Boot x86 kernel appraises kexec images and cannot without a file,
    before lockdown is asked) and kexec_file_load of an image without an Authenticode
    signature (ENODATA: no signature to verify, which lockdown makes fatal), and loads
    Debian's signed image with kexec_file_load (`kexec -s`); the
    kexec backend's check (asked by `config check` and before each reboot request) passes
    the signed image and refuses the unsigned one, naming lockdown and the image."""
    vm = node.oracle.vm
    image = node.kernel.image
    unsigned = tmp_path / "vmlinuz-unsigned"
    unsigned.write_bytes(_strip_authenticode(image.read_bytes()))
    guest_unsigned = vm.put(unsigned, "kexec/vmlinuz-unsigned")
    vm.python(KEXEC)
    assert vm.eval("kexec_plain()") == errno.EACCES
    assert "try using kexec_file_load" in vm.run("dmesg").stdout
    assert vm.eval(f"kexec_file({guest_unsigned!r})") == errno.ENODATA
    assert vm.eval(f"kexec_file({node.kernel.guest_image!r})") == 0
    check = "__import__('service.rebooting.backends', fromlist=['b'])._kexec_problem"
    layout = "__import__('service.layout', fromlist=['l']).Layout(__import__('pathlib').Path('/'))"
    # the image of the kernel the next boot runs: the running one here
    assert vm.eval(f"{check}({layout}, {node.release!r})") is None
    root = "/run/kexec-root"
    vm.run(
        f"mkdir -p {root}/boot {root}/proc/sys/kernel {root}/sys/kernel/security && "
        f"cp {guest_unsigned} {root}/boot/vmlinuz-{node.release} && "
        f"uname -r > {root}/proc/sys/kernel/osrelease && "
        f"cat /sys/kernel/security/lockdown > {root}/sys/kernel/security/lockdown"
    ).check()
    problem = vm.eval(
        f"{check}(__import__('service.layout', fromlist=['l']).Layout("
        f"__import__('pathlib').Path({root!r})), {node.release!r})"
    )
    assert problem is not None and "kexec under lockdown" in problem, problem
    assert "carries no Authenticode signature" in problem and "use backend systemd" in problem


BACKEND_CONFIGS = {
    "kured": 'backend = "kured"\nsentinel = "/run/modstage/reboot-required"',
    "systemd": 'backend = "systemd"',
    "command": 'backend = "command"\ncommand = ["touch", "/run/modstage-asked"]',
    "none": 'backend = "none"',
}


def test_every_other_reboot_backend_works_under_lockdown(node: Node) -> None:
    """Lockdown restricts only kexec among the reboot backends: under it, `modstage config
    check` passes kured, systemd, command and none (a sentinel file, `systemctl reboot` and a
    command all end in reboot(2), which lockdown leaves alone), and the backends that act
    without a service manager act: kured's sentinel is written and the command runs. (The
    node's init is busybox: `systemctl reboot` itself runs under systemd in test_systemd.py,
    without Secure Boot.)"""
    vm = node.oracle.vm
    assert "[integrity]" in vm.read("/sys/kernel/security/lockdown")
    prepare(vm, {"ca.pem": node.pki.ca.pem_cert.read_bytes()})
    for backend, keys in BACKEND_CONFIGS.items():
        prepare(vm, {}, f"[reboot]\n{keys}\n")
        rc, said = modstage(vm, "config", "check")
        assert rc == 0, f"{backend}: {said}"
        vm.python(
            "from service.config import Config\n"
            "from service.layout import Layout\n"
            "from service.rebooting.request import rebooter\n"
            "from pathlib import Path\n"
            "_cfg = Config.load(Path('/etc/modstage/config.toml'))\n"
            f"_asked = rebooter(_cfg.reboot, Layout(Path('/'))) if {backend!r} != 'systemd' "
            "else None\n"
            "_asked.request('test') if _asked is not None else None\n"
        )
    assert vm.eval("os.path.exists('/run/modstage/reboot-required')")
    assert vm.eval("os.path.exists('/run/modstage-asked')")

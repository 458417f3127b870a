"""The kernel as the oracle: the test bed, then every generated case judged by both.

The guest boots Debian's kernel with the test CA in its built-in keyring (see
tests/oracle/testbed.py and tests/vm/README.md), so test-signed modules load under
enforcement and the kernel's own verdict (an errno) can be compared with modstage's. Runs
once per kernel (Debian 12's 6.1, Debian 13's 6.12, sid's 7.2): modules built against that
kernel's headers, signed by its sign-file, judged by modstage against that kernel's own files.
"""

from __future__ import annotations

import errno
import json
import os
import shutil
import ssl
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.nvidia import Driver, driver_for
from tests.oracle import elf
from tests.oracle.cases import NEED_VERSIONS, SEED, Case, generate
from tests.oracle.driver import driver_cases, in_tree_dependencies
from tests.oracle.judge import (
    M_ACCEPT_K_REFUSE,
    UNNAMED,
    Outcome,
    compare,
    errno_name,
    modstage_verdicts,
    problems,
    table,
    target_root,
    trusted_dir,
    write_cases,
)
from tests.oracle.keyflags import KEY_FLAG_CERTS
from tests.oracle.mldsa import ml_dsa_signed
from tests.oracle.module import base_module, renamed
from tests.oracle.pki import Pki, ca_kind, issue, load_pki
from tests.oracle.target_kernel import use
from tests.oracle.testbed import OracleVm, boot_oracle, sign_file
from tests.vm.harness.builtin_key import find_builtin_cert
from tests.vm.harness.errors import VmError
from tests.vm.harness.kernel import Kernel

pytestmark = [pytest.mark.vm, pytest.mark.kernels("6.1", "6.12", "7.2")]

# What Debian's 6.1 does with each symbols case ("" = loads), as observed, with its log line:
# resolve_symbol's errno, the last one simplify_symbols met; an unresolved weak import is
# skipped. The GPL-only exports are invisible to a module whose license taints it P.
SYMBOLS_ERRNO = {
    "symbols/control": "",
    "symbols/unknown-symbol": "ENOENT",  # Unknown symbol _printq (err -2)
    "symbols/unknown-symbol-not-in-versions": "ENOENT",  # the lookup fails before the CRC's
    "symbols/unknown-weak-symbol": "",
    "symbols/missing-from-versions": "EINVAL",  # no symbol version for _printk
    "symbols/gpl-only-from-non-gpl": "ENOENT",  # Unknown symbol kobject_create_and_add (err -2)
    "symbols/namespace-not-imported": "EINVAL",  # uses symbol (dma_buf_put) from namespace ...
    "symbols/crc-gpl-symbol": "EINVAL",  # disagrees about version of symbol ...
    "symbols/crc-namespaced-symbol": "EINVAL",
    "symbols/crc-weak-symbol": "EINVAL",  # a weak import that resolves is checked too
    "symbols/non-gpl-without-gpl-imports": "",
}
# sid's 7.2 is built without CONFIG_MODVERSIONS: its modules have no __versions to edit, and
# the cases that edit one are not generated (tests/oracle/cases.py NEED_VERSIONS)
SYMBOLS_ERRNO_7_2 = {
    case: errno for case, errno in SYMBOLS_ERRNO.items() if case.split("/")[1] not in NEED_VERSIONS
}

# The real driver of a kernel's own Debian suite that does not build against it, with the
# line of its build log that says why. The test fails when it builds (add its cases then).
UNBUILDABLE_DRIVER = {
    # sid's nvidia-kernel-source 550.163.01-5.1 against 7.2.13: the kernel no longer has
    # strncpy, which nvidia/os-interface.c calls
    "7.2": ("os-interface.c", "error: implicit declaration of function", "strncpy"),
}


# The real NVIDIA driver's cases (tests/oracle/driver.py): what the kernel does with each, the
# same on both kernels. The loader accepts these and their init refuses: nvidia without a GPU
# (ENODEV), nvidia-peermem without a peer-memory provider (EINVAL).
DRIVER_INIT_REFUSES = {
    "nvidia/signed": "ENODEV",
    "nvidia/sha512": "ENODEV",
    "nvidia/other-release": "ENODEV",  # modversions: same_magic skips the release
    "nvidia/nvidia-peermem-alone": "EINVAL",
}
DRIVER_LOADER_REFUSES = {
    "nvidia/nvidia-modeset-alone": "ENOENT",  # Unknown symbol nvidia_get_rm_ops
    "nvidia/nvidia-uvm-alone": "ENOENT",
    "nvidia/nvidia-drm-alone": "ENOENT",
    "nvidia/tampered": "EKEYREJECTED",
    "nvidia/unknown-signer": "EKEYREJECTED",
    "nvidia/unsigned": "EKEYREJECTED",  # ENODATA, under enforcement
    "nvidia/crc-mismatch": "EINVAL",  # disagrees about version of symbol ...
    "nvidia/other-flags": "ENOEXEC",  # version magic ... should be ...
}


# Disagreements between the kernel and modstage that need a change in service/ (not the
# tests'), per kernel: listed so that they show as an xfail, never hidden. Strict: one that no
# longer occurs fails the test until it is removed from here.
KNOWN_DISAGREEMENTS: dict[str, dict[str, str]] = {"6.1": {}, "6.12": {}, "7.2": {}}


def _breaks_a_rule(outcome: Outcome) -> bool:
    return outcome.verdict in (M_ACCEPT_K_REFUSE, UNNAMED) or outcome.errno_check is False


@pytest.fixture(autouse=True)
def for_kernel(kernel: Kernel) -> Kernel:
    """Generate, sign and judge for this parametrisation's kernel."""
    use(kernel)
    return kernel


@pytest.fixture(scope="module")
def pki(kernel: Kernel) -> Pki:
    """The oracle's keys and certificates, with a CA that fits the kernel's built-in slot."""
    use(kernel)
    return load_pki(ca_kind(find_builtin_cert(kernel.vmlinux().read_bytes())[1]))


@pytest.fixture(scope="module")
def driver(kernel: Kernel) -> Driver | None:
    """The real NVIDIA driver of the kernel's own Debian release, built against its headers;
    None where UNBUILDABLE_DRIVER says it does not build, and its build fails as it says."""
    if kernel.series not in UNBUILDABLE_DRIVER:
        return driver_for(kernel)
    with pytest.raises(RuntimeError) as failed:
        driver_for(kernel)
    said = str(failed.value)
    assert all(words in said for words in UNBUILDABLE_DRIVER[kernel.series]), said[-3000:]
    return None


@pytest.fixture(scope="module")
def oracle(
    pki: Pki, driver: Driver | None, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[OracleVm]:
    """One prepared oracle guest for the whole module (the driver's in-tree dependencies
    loaded before enforcement, as Debian's key would let them load on a node)."""
    preload = tuple(in_tree_dependencies(driver)) if driver is not None else ()
    guest = boot_oracle(tmp_path_factory.mktemp("oracle-state"), pki, preload=preload)
    yield guest
    guest.vm.close()


def _load(oracle: OracleVm, data: bytes, name: str) -> int:
    host = oracle.vm.state_dir / "proof" / f"{name}.ko"
    host.parent.mkdir(parents=True, exist_ok=True)
    host.write_bytes(data)
    return int(oracle.guest(f"finit({oracle.vm.guest_path(host)!r})"))


def test_test_ca_is_the_only_builtin_key(oracle: OracleVm, pki: Pki) -> None:
    """The built-in keyring holds the test CA (and not Debian's build key); enforcement is on."""
    keys = oracle.guest("keyring_keys('.builtin_trusted_keys')")
    assert [k.split(";")[-1].split(":")[0] for k in keys] == ["modstage oracle CA"]
    proc_keys = oracle.vm.read("/proc/keys")
    assert "modstage oracle CA" in proc_keys
    assert "Build time autogenerated kernel key" not in proc_keys
    assert oracle.vm.read("/sys/module/module/parameters/sig_enforce") == "Y"


def test_secondary_leaves_signed_by_the_ca_are_added(oracle: OracleVm) -> None:
    """Every RSA leaf issued by the CA enters `.secondary_trusted_keys` at run time."""
    for name, serial in oracle.added.items():
        if name.startswith("rsa"):
            assert serial > 0, f"{name}: add_key gave errno {-serial}"


def test_kernel_judges_test_signed_modules(oracle: OracleVm, pki: Pki, tmp_path: Path) -> None:
    """Under enforcement: CA-signed loads, tampered and untrusted give EKEYREJECTED, a
    vermagic-flags mismatch gives ENOEXEC."""
    base = base_module()
    good = sign_file(renamed(base, 90001), pki.ca, tmp_path / "good.ko")
    assert _load(oracle, good, "good") == 0
    assert oracle.guest("unload('msorc_90001')") == 0
    tampered = bytearray(sign_file(renamed(base, 90002), pki.ca, tmp_path / "tampered.ko"))
    tampered[200] ^= 1
    assert _load(oracle, bytes(tampered), "tampered") == errno.EKEYREJECTED
    stranger = sign_file(renamed(base, 90003), pki["stranger"], tmp_path / "stranger.ko")
    assert _load(oracle, stranger, "stranger") == errno.EKEYREJECTED
    flags = renamed(base, 90004).replace(b" preempt mod_unload", b" preempt mod_unlXad")
    mismatch = sign_file(flags, pki.ca, tmp_path / "flags.ko")
    assert _load(oracle, mismatch, "flags") == errno.ENOEXEC


def test_differential_kernel_judges_modstage(
    oracle: OracleVm,
    pki: Pki,
    driver: Driver | None,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    for_kernel: Kernel,
) -> None:
    """Over >= 300 seeded cases and the real NVIDIA driver's (tests/oracle/driver.py),
    judged by `modstage verify` and by finit_module under
    enforcement in one boot: nothing modstage accepts is refused by the kernel, every module
    modstage refuses but the kernel loads is refused as a named policy, and every errno
    modstage claims is the kernel's, except the cases of KNOWN_DISAGREEMENTS (product changes
    owed; the test then xfails listing them, and fails if one no longer occurs). modstage
    judges twice: with the minimal target root
    (what a node without headers has: vmlinuz, config, the in-tree module tree and the
    module lists) and with the headers' Module.symvers too; with either, no module is
    refused as a policy on its symbols. The symbols cases get the errnos of SYMBOLS_ERRNO.
    The real driver's cases get the errnos of DRIVER_INIT_REFUSES and DRIVER_LOADER_REFUSES:
    `nvidia` signed by a trusted key passes every loader check and its init alone refuses
    (ENODEV without a GPU: the `module_load` event fired, for it and for no other refused
    case but those listed); its companions alone are refused for their imports from it."""
    release = oracle.vm.run("uname -r").check().stdout.strip()
    began = time.monotonic()
    cases = generate(pki, tmp_path / "gen", SEED)
    assert len(cases) >= 300 and len({c.name for c in cases}) == len(cases)
    if driver is not None:  # 7.2: sid's driver does not build (UNBUILDABLE_DRIVER)
        cases += driver_cases(driver, pki, tmp_path / "nvidia")
    assert len({c.filename for c in cases}) == len(cases)
    paths = write_cases(cases, oracle.vm.state_dir / "cases")
    generated = time.monotonic()
    trusted = trusted_dir(pki, tmp_path / "trusted")
    verdicts = {
        label: modstage_verdicts(
            list(paths.values()), target_root(tmp_path / label, release, symvers=symvers),
            trusted, release,
        )
        for label, symvers in (("minimal root", False), ("root with Module.symvers", True))
    }  # fmt: skip
    judged = time.monotonic()
    kernel = kernel_verdicts(oracle, cases, paths)
    timing = (
        f"{len(cases)} cases: generated in {generated - began:.1f} s, modstage verify x2 "
        f"{judged - generated:.1f} s, kernel (finit_module in the guest) "
        f"{time.monotonic() - judged:.1f} s"
    )
    known = KNOWN_DISAGREEMENTS[for_kernel.series]
    sections, broken, rows, seen = [timing], [], [], set()
    for label, modstage in verdicts.items():
        outcomes = compare(cases, paths, modstage, kernel)
        seen |= {o.case for o in outcomes if o.case in known and _breaks_a_rule(o)}
        found = [f"[{label}] {p}" for p in problems([o for o in outcomes if o.case not in known])]
        sections += [f"== modstage with the {label}", table(outcomes), *found]
        broken += found
        rows += [f"{label}\t{o.case}\t{o.verdict}\t{o.kernel_text()}\t{o.reason}" for o in outcomes]
    report = "\n".join(sections)
    default = tmp_path / "oracle.txt"
    Path(os.environ.get("MODSTAGE_ORACLE_REPORT", default)).write_text(
        report + "\n" + "\n".join(rows)
    )
    with capsys.disabled():
        print(f"\n{report}")
    assert kernel["baseline/ca-sha256-issuer"]["errno"] == 0, "the test bed refuses a good module"
    symbols = {c.id: errno_name(kernel[c.id]["errno"]) for c in cases if c.category == "symbols"}
    assert symbols == (SYMBOLS_ERRNO_7_2 if for_kernel.series == "7.2" else SYMBOLS_ERRNO)
    initialised = {case for case, k in kernel.items() if k.get("init_called")}
    driver_errnos = {
        c.id: errno_name(kernel[c.id]["errno"]) for c in cases if c.category == "nvidia"
    }
    if driver is None:
        assert not initialised and not driver_errnos
    else:
        assert initialised == set(DRIVER_INIT_REFUSES)
        assert driver_errnos == {**DRIVER_INIT_REFUSES, **DRIVER_LOADER_REFUSES}
        assert "NVRM: No NVIDIA GPU found." in oracle.vm.run("dmesg").check().stdout
    for label, modstage in verdicts.items():  # the kernel's files give every export's CRC
        on_symbols = [
            f"{c.id}: {v['reason']}"
            for c in cases
            if (v := modstage[str(paths[c.id].resolve())])["policy"] and "symbol" in v["reason"]
        ]
        assert not on_symbols, f"[{label}] policy refusals on symbols: {on_symbols}"
    assert not broken, report
    stale = sorted(set(known) - seen)
    assert not stale, f"known disagreements that no longer occur (remove them): {stale}"
    if seen:
        listing = "\n".join(f"  {case}: {known[case]}" for case in sorted(seen))
        pytest.xfail(f"{len(seen)} known disagreements on {for_kernel.series}:\n{listing}")


def kernel_verdicts(oracle: OracleVm, cases: list[Case], paths: dict[str, Path]) -> dict[str, Any]:
    """finit_module every case in the guest, in one batch; case id -> the guest's result."""
    plan = [
        {"id": c.id, "path": oracle.vm.guest_path(paths[c.id]), "name": c.name,
         "compressed": c.compressed}
        for c in cases
    ]  # fmt: skip
    (oracle.vm.state_dir / "plan.json").write_text(json.dumps(plan))
    guest_dir = oracle.vm.guest_path(oracle.vm.state_dir)
    oracle.guest(f"judge_all('{guest_dir}/plan.json', '{guest_dir}/kernel.json')", timeout=900)
    result: dict[str, Any] = json.loads((oracle.vm.state_dir / "kernel.json").read_text())
    return result


@pytest.mark.kernels("7.2")  # ML-DSA keys come from sid's OpenSSL 3.6
def test_ml_dsa_signature_is_refused_as_the_kernel_refuses_it(
    oracle: OracleVm, pki: Pki, tmp_path: Path, kernel: Kernel
) -> None:
    """7.2 offers ML-DSA module signing keys in Kconfig, but Debian builds it without
    CONFIG_CRYPTO_MLDSA: a module signed by an ML-DSA-65 key (its certificate issued by the
    test CA, offered to `.secondary_trusted_keys` and given to modstage as trusted) does not
    load under enforcement (EKEYREJECTED), and modstage refuses it with the same errno, as
    the kernel's refusal (no verifier), not its own policy."""
    cert, module = ml_dsa_signed(kernel, pki, tmp_path)
    der = ssl.PEM_cert_to_DER_cert(cert.read_text())
    added = oracle.guest(f"add_certificate({der!r})")
    assert _load(oracle, module.read_bytes(), "mldsa") == errno.EKEYREJECTED
    trusted = trusted_dir(pki, tmp_path / "trusted")
    shutil.copyfile(cert, trusted / "mldsa.pem")
    root = target_root(tmp_path / "root", kernel.release)
    [verdict] = modstage_verdicts([module], root, trusted, kernel.release).values()
    assert (verdict["ok"], verdict["errno"], verdict["policy"]) == (False, "EKEYREJECTED", False)
    assert "no ML-DSA verifier" in verdict["reason"], verdict
    print(f"\nML-DSA-65 on 7.2: add_key gave {added}; modstage: {verdict['reason']}")


def test_key_usage_and_basic_constraints_decide_trust_as_the_kernel_does(
    oracle: OracleVm, pki: Pki, tmp_path: Path, kernel: Kernel
) -> None:
    """Each KEY_FLAG_CERTS certificate (issued by the test CA) is offered to
    `.secondary_trusted_keys` and put in modstage's trusted directory, and signs a module.
    From 6.4 on (6.12, 7.2) a malformed keyUsage or basicConstraints, and a keyUsage with no
    bit set (valid DER, 03 01 00), make add_key fail with EBADMSG and the module gets
    EKEYREJECTED; 6.1 loads all three. A CA certificate without
    digitalSignature, and a leaf with neither digitalSignature nor keyCertSign, enter the
    keyring and verify their module on all three: module signature checks read no key flag.
    modstage gives each module the kernel's verdict and errno for that kernel."""
    refusing = kernel.series != "6.1"
    trusted = trusted_dir(pki, tmp_path / "trusted")
    modules, expected, seen = {}, {}, {}
    for i, (name, (extensions, malformed)) in enumerate(KEY_FLAG_CERTS.items()):
        cred = issue(pki, "chain2048", 4100 + i, f"modstage oracle {name}", extensions, tmp_path)
        shutil.copyfile(cred.pem_cert, trusted / f"{name}.pem")
        refused = malformed and refusing
        added = oracle.guest(f"add_certificate({cred.der!r})")
        assert (added == -errno.EBADMSG) if refused else added > 0, (name, added)
        modules[name] = tmp_path / f"{name}.ko"
        data = sign_file(renamed(base_module(), 90030 + i), cred, modules[name])
        seen[name] = _load(oracle, data, name)
        if seen[name] == 0:
            assert oracle.guest(f"unload('msorc_{90030 + i:05d}')") == 0
        expected[name] = errno.EKEYREJECTED if refused else 0
    assert seen == expected
    root = target_root(tmp_path / "root", kernel.release)
    verdicts = modstage_verdicts(list(modules.values()), root, trusted, kernel.release)
    judged = {
        name: (v := verdicts[str(path.resolve())])["errno"] or ("" if v["ok"] else v["reason"])
        for name, path in modules.items()
    }
    assert judged == {n: errno_name(e) if e else "" for n, e in expected.items()}, verdicts


@pytest.mark.kernels("7.2")  # the loader ignores a module's __ksymtab_gpl from 7.1 on
def test_a_modules_ksymtab_gpl_exports_nothing_on_7_2(
    oracle: OracleVm, pki: Pki, tmp_path: Path, test_modules: dict[str, Path], kernel: Kernel
) -> None:
    """ms_exporter with its `__ksymtab` renamed `__ksymtab_gpl` loads (the kernel warns that
    it ignores the section) and ms_consumer, importing its export, is then refused ENOENT;
    with the exporter as built the consumer loads. modstage, judging the two as one bundle in
    that order, gives each the kernel's verdict."""
    built = test_modules["ms_exporter"].read_bytes()
    variants = {
        "gpl-section": elf.rename_section(built, "__ksymtab", "__ksymtab_gpl"),
        "built": built,
    }
    consumer = sign_file(test_modules["ms_consumer"].read_bytes(), pki.ca, tmp_path / "c.ko")
    root = target_root(tmp_path / "root", kernel.release)
    trusted = trusted_dir(pki, tmp_path / "trusted")
    for label, exporter in variants.items():
        (tmp_path / label).mkdir()
        signed = sign_file(exporter, pki.ca, tmp_path / label / "ms_exporter.ko")
        assert _load(oracle, signed, f"{label}-exporter") == 0
        want = errno.ENOENT if label == "gpl-section" else 0
        assert _load(oracle, consumer, f"{label}-consumer") == want, label
        if not want:
            assert oracle.guest("unload('ms_consumer')") == 0
        assert oracle.guest("unload('ms_exporter')") == 0
        paths = [tmp_path / label / "ms_exporter.ko", tmp_path / "c.ko"]
        verdicts = modstage_verdicts(paths, root, trusted, kernel.release, apart=False)
        judged = [verdicts[str(p.resolve())]["errno"] or "" for p in paths]
        assert judged == ["", errno_name(want)], (label, verdicts)
    assert "ignoring obsolete section __ksymtab_gpl" in oracle.vm.run("dmesg").check().stdout


# What finit_module returns for a module whose init returns -EEXIST: do_init_module passes it
# on before 7.1 and turns it into EBUSY from 7.1 ("module: Override -EEXIST module return")
INIT_EEXIST = {"6.1": "EEXIST", "6.12": "EEXIST", "7.2": "EBUSY"}


def test_an_init_returning_eexist_reaches_userspace_as_the_release_says(
    oracle: OracleVm, pki: Pki, tmp_path: Path, test_modules: dict[str, Path], kernel: Kernel
) -> None:
    """ms_enodev with its init's `mov $-ENODEV, %eax` made `-EEXIST` gives finit_module the
    errno of INIT_EEXIST, and modstage's text for that errno names an init's EEXIST."""
    from service.host.modules import describe

    patched = elf.replace_in_section(
        test_modules["ms_enodev"].read_bytes(), ".init.text", b"\xb8\xed\xff\xff\xff",
        b"\xb8\xef\xff\xff\xff",
    )  # fmt: skip
    got = errno_name(_load(oracle, sign_file(patched, pki.ca, tmp_path / "m.ko"), "eexist"))
    assert got == INIT_EEXIST[kernel.series]
    assert "init returned EEXIST" in describe(getattr(errno, got))


def test_a_module_whose_btf_the_kernel_cannot_parse_is_judged_as_its_config_says(
    oracle: OracleVm, pki: Pki, tmp_path: Path, test_modules: dict[str, Path], kernel: Kernel
) -> None:
    """ms_exporter with a `.BTF` whose magic is wrong (in place of the one kbuild's pahole
    step made, or added where it made none): every Debian kernel reads module BTF; 6.1 and
    6.12 set CONFIG_MODULE_ALLOW_BTF_MISMATCH, so btf_module_notify warns and loads it, and
    sid's 7.2 does not, so it refuses it EINVAL. modstage, judging it against the kernel's own
    files and config, gives the kernel's verdict."""
    from service.verify.targetkernel.kconfig import KernelConfig
    from service.verify.targetkernel.rules import KernelRules

    root = target_root(tmp_path / "root", kernel.release)
    config = next(
        p
        for p in (root / "boot" / f"config-{kernel.release}",
                  root / "lib" / "modules" / kernel.release / "config")
        if p.exists()
    )  # fmt: skip
    rules = KernelRules.of(kernel.release, KernelConfig.parse(config.read_text(), str(config)))
    assert rules.module_btf
    want = 0 if rules.btf_mismatch_allowed else errno.EINVAL
    blob, plain = tmp_path / "btf.bin", tmp_path / "plain.ko"
    blob.write_bytes(b"\x34\x12\x01\x00\x18" + b"\0" * 19 + b"\0")
    built = test_modules["ms_exporter"]
    # 6.12's and 7.2's kbuild make module BTF with pahole; 6.1's headers cannot (no vmlinux)
    how = "--update-section" if elf.has_section(built.read_bytes(), ".BTF") else "--add-section"
    subprocess.run(["objcopy", how, f".BTF={blob}", str(built), str(plain)], check=True)
    (tmp_path / "btf").mkdir()
    signed = sign_file(plain.read_bytes(), pki.ca, tmp_path / "btf" / "ms_exporter.ko")
    assert _load(oracle, signed, "btf-mismatch") == want
    assert "BTF" in oracle.vm.run("dmesg | tail -n 20").check().stdout
    if not want:
        assert oracle.guest("unload('ms_exporter')") == 0
    path = tmp_path / "btf" / "ms_exporter.ko"
    verdicts = modstage_verdicts([path], root, trusted_dir(pki, tmp_path / "trusted"),
                                 kernel.release, apart=False)  # fmt: skip
    assert (verdicts[str(path.resolve())]["errno"] or "") == errno_name(want), verdicts


def short_this_module(pki: Pki, directory: Path) -> bytes:
    """A CA-signed module whose .gnu.linkonce.this_module is 0x100 bytes (struct module is
    0x380 on Debian's 6.1)."""
    payload = elf.set_section(
        renamed(base_module(), 90010), ".gnu.linkonce.this_module", size=0x100
    )
    return sign_file(payload, pki.ca, directory / "short.ko")


def test_short_this_module_oopses_the_kernel(
    oracle: OracleVm, pki: Pki, tmp_path: Path, kernel: Kernel
) -> None:
    """Kernel fact found by the oracle: 6.1 does not check the size of
    .gnu.linkonce.this_module, and a signed module with a short one oopses in add_kallsyms
    (the loading process dies). 6.12 and 7.2 check it (size == sizeof(struct module)) and refuse
    the module with ENOEXEC. Runs last: on 6.1 it takes the shared guest down."""
    data = short_this_module(pki, tmp_path)
    if kernel.series != "6.1":
        assert _load(oracle, data, "short") == errno.ENOEXEC
        return
    with pytest.raises(VmError):
        _load(oracle, data, "short")
    assert "add_kallsyms" in oracle.vm.serial_log

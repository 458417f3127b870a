"""The intake pre-flight asks the enforcing running kernel what mod_verify_sig will ask."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest

from service.layout import Layout
from stager.drop import ModuleSpec, stage
from tests.hosts import KEEP, running_host
from tests.kmod import SigningKey, sign
from tests.service.conftest import HostTree
from tests.service.fakes import FakeKeyring, make_intake


@pytest.fixture
def host(host_tree: HostTree) -> Layout:
    """The target is the running kernel (Debian's config: .platform fallback), enforcing."""
    return host_tree(enforcing=True)


def take(
    host: Layout, kernel: str, module: Path, keyring: FakeKeyring, version: str = "1"
) -> tuple[str, ...]:
    specs = [ModuleSpec(module, "")]
    stage(host.incoming, bundle="p", version=version, kernel=kernel, modules=specs)
    intake = make_intake(host, keyring=keyring)
    [outcome] = intake.run()
    return outcome.reasons


def test_platform_keyring_counts_on_enokey_and_blacklisted_hashes_do_not_load(
    host: Layout, modules: dict[str, Path], rsa_key: SigningKey, kernel: str, tmp_path: Path
) -> None:
    """A MOK/db key in .platform is enough (Debian's fallback); a module hash in .blacklist
    is refused even with a trusted signer."""
    signed = sign(modules["ms_params"], rsa_key, tmp_path / "ms_params.ko")
    probe = FakeKeyring(set())
    assert take(host, kernel, signed, probe)  # nowhere: refused
    key_id = probe.asked[0]
    assert take(host, kernel, signed, FakeKeyring(set(), platform={key_id})) == ()
    digest = hashlib.sha256(signed.read_bytes()).hexdigest()
    reasons = take(host, kernel, signed, FakeKeyring({key_id}, blacklist={digest}), "2")
    assert len(reasons) == 1 and reasons[0].endswith(f"module hash {digest} is in .blacklist")


def test_a_blacklisted_hash_is_the_kernels_refusal_before_6_17_and_policy_after(
    host: Layout, kernel: str
) -> None:
    """Debian's kernels refused a module whose hash dbx lists (`.blacklist`) until 6.17, which
    dropped that patch: the pre-flight says EKEYREJECTED for the running 6.1 and
    "EKEYREJECTED (policy)", naming the change, for a running 7.2 (the node loads it)."""
    from service.intake.admit import preflight
    from service.verify.targetkernel.kernel import Target
    from service.verify.verdict import Verdict
    from stager.schema.manifest import Manifest, ModuleEntry

    digest = "ab" * 32
    said = []
    for release in (kernel, "7.2.13+deb14-amd64"):
        running_host(host, release, KEEP)
        manifest = Manifest("p", "1", release, (ModuleEntry("m.ko", ""),))
        verdict = Verdict("m.ko", True, key_id="aa", sha256=digest)
        keyring = FakeKeyring({"aa"}, blacklist={digest})
        [reason] = preflight(host, keyring, manifest, [verdict], Target.from_spec(release))
        said.append(reason)
    assert said[0] == f"m.ko: EKEYREJECTED: module hash {digest} is in .blacklist"
    assert said[1].startswith(f"m.ko: EKEYREJECTED (policy): module hash {digest} is in")
    assert "dropped it in 6.17" in said[1]


def test_the_hash_check_ends_exactly_at_6_17(host: Layout) -> None:
    """Debian dropped its `.blacklist` hash patch in 6.17: the running kernel's own refusal
    holds for a 6.16 release and the policy refusal from 6.17.0 on."""
    from service.intake.admit import preflight
    from service.verify.targetkernel.kernel import Target
    from service.verify.verdict import Verdict
    from stager.schema.manifest import Manifest, ModuleEntry

    digest = "cd" * 32
    said = {}
    for release in ("6.16.12-1-amd64", "6.17.0-1-amd64"):
        running_host(host, release, KEEP)
        manifest = Manifest("p", "1", release, (ModuleEntry("m.ko", ""),))
        verdict = Verdict("m.ko", True, key_id="aa", sha256=digest)
        keyring = FakeKeyring({"aa"}, blacklist={digest})
        [said[release]] = preflight(host, keyring, manifest, [verdict], Target.from_spec(release))
    before, after = said.values()
    assert before.startswith("m.ko: EKEYREJECTED: module hash")
    assert after.startswith("m.ko: EKEYREJECTED (policy): module hash")

"""What intake asks of a drop before it becomes a generation (``service.intake.admit``), on
plain values: the host's policy, a failed generation, the exports a stored bundle offers and
the refusal that names an untrusted signer."""

from __future__ import annotations

import shutil
from pathlib import Path

from service.bundles.state import BundleState, Generation
from service.config import Config
from service.intake.admit import bundle_exports, policy_problems, untrusted_signer
from service.verify.signature.trust import TrustStore
from service.verify.targetkernel.exports import read_module_exports
from stager.schema.manifest import Manifest, MemoryPolicy, ModuleEntry
from tests.kmod import SigningKey


def manifest(bundle: str = "b", params: str = "", memory: MemoryPolicy | None = None) -> Manifest:
    return Manifest(bundle, "1", "6.1.0-1-amd64", (ModuleEntry("m.ko", "", params),), memory=memory)


def test_a_bundle_the_host_does_not_allow_is_refused_by_name() -> None:
    """With ``allowed_bundles`` set, a bundle outside it has one problem naming it; one inside
    it has none."""
    config = Config(allowed_bundles=("good",))
    assert policy_problems(config, manifest("good"), BundleState()) == []
    [problem] = policy_problems(config, manifest("evil"), BundleState())
    assert "'evil'" in problem and "not allowed" in problem


def test_a_memory_policy_the_host_does_not_allow_is_refused_by_name() -> None:
    """A manifest's memory policy outside ``allowed_memory_policies`` is one problem naming the
    policy; an allowed one, and none at all, are none."""
    config = Config(allowed_memory_policies=(MemoryPolicy.ONLINE,))
    bundle = BundleState()
    assert policy_problems(config, manifest(memory=MemoryPolicy.ONLINE), bundle) == []
    assert policy_problems(config, manifest(memory=None), bundle) == []
    [problem] = policy_problems(config, manifest(memory=MemoryPolicy.OFFLINE), bundle)
    assert repr(MemoryPolicy.OFFLINE.value) in problem


def test_a_forbidden_parameter_is_refused_however_its_dashes_are_spelled() -> None:
    """``forbidden_params`` names a parameter with ``-`` or ``_`` alike: a module setting it
    (either spelling) has one problem naming the parameter and the module's index; a module
    setting other parameters has none."""
    config = Config(forbidden_params=("no-sig",))
    bundle = BundleState()
    assert policy_problems(config, manifest(params="other=1"), bundle) == []
    for spelling in ("no_sig", "no-sig"):
        [problem] = policy_problems(config, manifest(params=f"{spelling}=1"), bundle)
        assert problem.startswith("module[0].params: ") and repr(spelling) in problem


def test_a_generation_that_already_failed_is_refused_with_its_id_and_failure() -> None:
    """The same manifest (the same digest) as a generation that failed is refused, naming the
    generation's 12-character id and the failure; a generation that did not fail is not."""
    m = manifest()
    ok = Generation(m.digest, "1", m.kernel)
    assert policy_problems(Config(), m, BundleState(generations={m.digest: ok})) == []
    failed = Generation(m.digest, "1", m.kernel, failed="oops")
    [problem] = policy_problems(Config(), m, BundleState(generations={m.digest: failed}))
    assert problem == f"generation {m.digest[:12]} already failed: oops"


def test_a_stored_bundle_exports_what_its_readable_modules_export(
    modules: dict[str, Path], tmp_path: Path
) -> None:
    """``bundle_exports`` is the union of its modules' exports; a module that cannot be read
    exports nothing and does not stop the others."""
    shutil.copy(modules["ms_exporter"], tmp_path / "ms_exporter.ko")
    (tmp_path / "junk.ko").write_bytes(b"not an ELF file")
    entries = (ModuleEntry("junk.ko", ""), ModuleEntry("ms_exporter.ko", ""))
    m = Manifest("b", "1", "6.1.0-1-amd64", entries)
    expected = read_module_exports(tmp_path / "ms_exporter.ko")
    assert expected  # the test module exports a symbol
    assert bundle_exports(tmp_path, m) == expected


def test_an_untrusted_signer_is_named_with_the_certificate_to_enroll(
    rsa_key: SigningKey,
) -> None:
    """The refusal names the key id, the signer and, when modstage trusts the key, the file
    of its certificate as the ``mokutil --import`` argument; otherwise a placeholder."""
    trust = TrustStore.from_der(rsa_key.cert_der.read_bytes())
    [key] = trust.keys
    key_id = key.key_ids[0].hex()
    known = untrusted_signer("sig_enforce", key_id, "modstage rsa", trust)
    assert f"signing key {key_id} (modstage rsa)" in known
    assert f"mokutil --import {key.source}," in known
    for store in (None, TrustStore()):
        unknown = untrusted_signer("sig_enforce", key_id, None, store)
        assert "mokutil --import <its certificate>," in unknown
        assert f"signing key {key_id}:" in unknown

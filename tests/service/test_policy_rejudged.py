"""A bundle's ``[bundles.<name>]`` rules on module names and signers apply at every judgement,
as the config reads then, not only when a generation is first taken in: ``modstage boot``
applies them again to each module it verifies (a policy tightened after a generation was
taken in, or after an admin's ``retry`` made it pending again, takes effect at the next boot:
the generation fails naming the rule, with nothing of it loaded), and intake judges a drop of
a generation the store holds already again from the stored copy.

Each test takes a generation in under the defaults, tightens the config, and boots with a
recording kernel or drops the same generation again.
"""

from __future__ import annotations

import io
import shutil
from pathlib import Path

from service.bundles.phase import Phase
from service.cli import main
from service.config import BundlePolicy, Config
from service.layout import Layout, modules_dir
from stager.drop import ModuleSpec, stage
from tests.kmod import SigningKey, make_key
from tests.service.fakes import FakeKernel, boot_with, make_intake


def taken_in(host: Layout, kernel: str, *modules: Path) -> str:
    """Stage ``modules`` as bundle ``test`` and take them in under the defaults; the pending
    generation."""
    stage(host.incoming, bundle="test", version="1", kernel=kernel,
          modules=[ModuleSpec(m, "") for m in modules])  # fmt: skip
    [outcome] = make_intake(host).run()
    assert outcome.accepted, outcome.reasons
    return str(outcome.generation)


def boot(host: Layout, policy: BundlePolicy) -> tuple[FakeKernel, str | None, Phase]:
    """Boot with ``[bundles.test]`` = ``policy``: the kernel, the pending-turned-failed
    generation's failure (None when it did not fail) and the bundle's phase."""
    fake = FakeKernel()
    state = boot_with(host, fake, bundles=(("test", policy),)).run()
    b = state.bundle("test")
    failed = [g.failed for g in b.generations.values() if g.failed]
    return fake, (failed[0] if failed else None), b.phase


def test_signers_set_after_intake_refuse_the_generation_at_the_next_boot(
    host: Layout, signed: dict[str, Path], kernel: str, tmp_path: Path
) -> None:
    """A generation signed by the host's RSA key, taken in without ``signers``, fails at the
    boot after ``signers`` names only another trusted certificate: the failure names the
    module, its signer and the signers allowed, and nothing is loaded."""
    taken_in(host, kernel, signed["ms_params"])
    vendor = make_key(tmp_path / "vendor", "rsa2048", cn="other vendor")
    shutil.copy(vendor.cert_pem, host.trusted / "vendor.pem")
    fake, failed, phase = boot(host, BundlePolicy(signers=("vendor.pem",)))
    assert phase is Phase.FAILED and not fake.loaded()
    assert failed is not None and failed.startswith(
        "modules/ms_params.ko: signed by 'modstage rsa'"
    )
    assert failed.endswith('[bundles.test] signers = ["vendor.pem"] allows only those')


def test_the_signers_own_certificate_still_boots(
    host: Layout, signed: dict[str, Path], kernel: str, rsa_key: SigningKey
) -> None:
    """``signers`` naming the certificate that signed the generation loads it (the control
    of the test above)."""
    taken_in(host, kernel, signed["ms_params"])
    fake, failed, phase = boot(host, BundlePolicy(signers=(rsa_key.cert_pem.name,)))
    assert (phase, failed, list(fake.loaded())) == (Phase.ACTIVE, None, ["ms_params"])


def test_module_globs_set_after_intake_refuse_the_generation_at_the_next_boot(
    host: Layout, signed: dict[str, Path], kernel: str
) -> None:
    """``modules = ["ms_params"]`` set after a generation of ms_exporter and ms_params was
    taken in: the next boot fails it at ms_exporter, naming the globs, before anything loads."""
    taken_in(host, kernel, signed["ms_exporter"], signed["ms_params"])
    fake, failed, phase = boot(host, BundlePolicy(modules=("ms_params",)))
    assert phase is Phase.FAILED and not fake.loaded()
    assert failed == (
        'modules/ms_exporter.ko: module ms_exporter matches none of [bundles.test] modules = ["ms_params"]'
    )


def test_an_in_tree_name_allowed_at_intake_is_refused_once_shadow_in_tree_no_longer_names_it(
    host: Layout, signed: dict[str, Path], kernel: str
) -> None:
    """With ``ms_params`` in the running kernel's tree (``modules.dep``), a generation taken
    in under ``shadow_in_tree = ["ms_*"]`` loads while the config says so, and fails at a
    boot whose config no longer allows it, naming the in-tree module."""
    with (modules_dir(host, kernel) / "modules.dep").open("a") as f:
        f.write("kernel/misc/ms_params.ko:\n")
    stage(host.incoming, bundle="test", version="1", kernel=kernel,
          modules=[ModuleSpec(signed["ms_params"], "")])  # fmt: skip
    allow = BundlePolicy(shadow_in_tree=("ms_*",))
    [outcome] = make_intake(host, Config(bundles=(("test", allow),))).run()
    assert outcome.accepted, outcome.reasons
    fake, failed, phase = boot(host, BundlePolicy())
    assert phase is Phase.FAILED and not fake.loaded()
    assert failed == (
        f"modules/ms_params.ko: module ms_params would take the place of the target kernel's "
        f"in-tree module /lib/modules/{kernel}/kernel/misc/ms_params.ko; [bundles.test] "
        "shadow_in_tree does not name it"
    )


def test_a_retried_generation_is_judged_again_by_the_policy_of_its_boot(
    host: Layout, signed: dict[str, Path], kernel: str
) -> None:
    """A generation the policy failed at boot, retried by the admin while the policy stands,
    fails again at the next boot; retried once the policy allows it, it loads."""
    gen = taken_in(host, kernel, signed["ms_params"])
    tight = BundlePolicy(modules=("nvidia",))
    assert boot(host, tight)[1] is not None

    def retry() -> None:
        out = io.StringIO()
        assert main(["retry", "--root", str(host.root), "test", gen[:12]], out) == 0, out

    retry()
    fake, failed, phase = boot(host, tight)
    assert phase is Phase.FAILED and not fake.loaded()
    assert failed is not None and "matches none of [bundles.test] modules" in failed
    retry()
    fake, failed, phase = boot(host, BundlePolicy(modules=("ms_*",)))
    assert (phase, failed, list(fake.loaded())) == (Phase.ACTIVE, None, ["ms_params"])


def test_a_drop_of_a_stored_generation_is_judged_by_the_policy_of_now(
    host: Layout, signed: dict[str, Path], kernel: str
) -> None:
    """The same drop again (its generation in the store already) under ``modules`` that no
    longer match it is refused at intake, naming the rule, as a new generation would be;
    under the defaults it is taken in again."""
    gen = taken_in(host, kernel, signed["ms_params"])
    tight = Config(bundles=(("test", BundlePolicy(modules=("nvidia",))),))
    stage(host.incoming, bundle="test", version="1", kernel=kernel,
          modules=[ModuleSpec(signed["ms_params"], "")])  # fmt: skip
    [outcome] = make_intake(host, tight).run()
    assert outcome.reasons == (
        'modules/ms_params.ko: module ms_params matches none of [bundles.test] modules = ["nvidia"]',
    )
    assert taken_in(host, kernel, signed["ms_params"]) == gen

"""The boot loader's own judgement of a generation, against what intake accepted."""

from __future__ import annotations

import errno
from pathlib import Path

import pytest

from service.bundles.phase import Phase
from service.config import Config
from service.host.modules import describe
from service.layout import Layout, kernel_image, modules_dir
from service.verify.signature.trust import TrustStore
from service.verify.verdict import verify_module
from stager.drop import ModuleSpec, stage
from tests.service.fakes import FakeKernel, boot_with, make_intake


def _unchecked(host: Layout, signed: dict[str, Path], kernel: str) -> str:
    """Take in ms_exporter and ms_consumer where none of the target's exports can be read
    (no image, no Module.symvers, no cache) under ``require_symbol_crcs = false``: their
    imports' CRCs are unchecked. Returns the pending generation."""
    assert not kernel_image(host, kernel).exists()
    assert not host.exports_cache(kernel).exists()
    (modules_dir(host, kernel) / "build/Module.symvers").unlink()
    mods = [signed["ms_exporter"], signed["ms_consumer"]]
    stage(host.incoming, bundle="test", version="1", kernel=kernel,
          modules=[ModuleSpec(p, "") for p in mods])  # fmt: skip
    [outcome] = make_intake(host, Config(require_symbol_crcs=False)).run()
    assert outcome.accepted, outcome.reasons
    return str(outcome.generation)


def test_a_generation_taken_in_with_unchecked_crcs_boots(
    host: Layout, signed: dict[str, Path], kernel: str
) -> None:
    """A generation intake took in with unchecked CRCs (``require_symbol_crcs = false``)
    loads at boot, and the boot's own re-verification (its full target, used to explain a
    refusal) accepts each module as intake did: it leaves unknown CRCs to the kernel."""
    gen = _unchecked(host, signed, kernel)
    fake = FakeKernel()
    boot = boot_with(host, fake, require_symbol_crcs=False)
    state = boot.run()
    b = state.bundle("test")
    assert (b.phase, b.active) == (Phase.ACTIVE, gen), b.generations[gen].failed
    assert [c[1] for c in fake.calls] == ["ms_exporter", "ms_consumer"]
    assert not boot.full_target.exports.complete  # nothing more was known at boot
    trust = TrustStore.from_directory(host.trusted)
    for name in ("ms_exporter", "ms_consumer"):
        with open(signed[name], "rb") as f:
            v = verify_module(f, display=name, trust=trust, kernel=boot.full_target)
        assert v.ok, v.reason


@pytest.mark.parametrize("code", [errno.EINVAL, errno.ENOENT])
def test_a_kernel_refusal_of_such_a_module_keeps_the_kernels_words(
    host: Layout, signed: dict[str, Path], kernel: str, code: int
) -> None:
    """When the kernel refuses (EINVAL or ENOENT) a module taken in with unchecked CRCs,
    boot judges it again with the target's exports to name the symbol; knowing no more
    CRCs than intake did, that judgement accepts it as intake did, so the generation's
    failure is the kernel's own words, never a policy refusal of unknown symbols."""
    gen = _unchecked(host, signed, kernel)
    state = boot_with(host, FakeKernel(fail={"ms_consumer": code})).run()
    b = state.bundle("test")
    assert (b.phase, b.active, b.pending) == (Phase.FAILED, None, None)
    assert b.generations[gen].failed == f"modules/ms_consumer.ko: {describe(code)}"


def _pending(host: Layout, signed: dict[str, Path], kernel: str) -> str:
    """Take in ms_exporter and ms_consumer, signed by the trusted key; the pending id."""
    mods = [signed["ms_exporter"], signed["ms_consumer"]]
    stage(host.incoming, bundle="test", version="1", kernel=kernel,
          modules=[ModuleSpec(p, "") for p in mods])  # fmt: skip
    [outcome] = make_intake(host).run()
    assert outcome.accepted, outcome.reasons
    return str(outcome.generation)


def test_a_module_changed_in_the_store_is_not_loaded(
    host: Layout, signed: dict[str, Path], kernel: str
) -> None:
    """Boot loads only the bytes intake recorded: a stored module replaced by another one,
    validly signed by the same trusted key, is refused for its digest before the kernel is
    asked, and the generation fails with nothing of it left loaded."""
    gen = _pending(host, signed, kernel)
    [stored] = host.store.glob(f"{gen}*/**/ms_consumer.ko")
    stored.chmod(0o644)
    stored.write_bytes(signed["ms_params"].read_bytes())
    fake = FakeKernel()
    b = boot_with(host, fake).run().bundle("test")
    assert (b.phase, b.active) == (Phase.FAILED, None)
    failed = b.generations[gen].failed
    assert failed is not None and "digest changed in the store" in failed, failed
    assert [c[1] for c in fake.calls if c[0] == "load"] == ["ms_exporter"]
    assert not fake.loaded()  # ms_exporter unloaded again


def test_a_module_its_host_no_longer_trusts_is_not_loaded(
    host: Layout, signed: dict[str, Path], kernel: str
) -> None:
    """Boot verifies each stored module again with the host's certificates of the moment:
    once the signer's certificate is gone from ``trusted.d``, nothing of the generation is
    loaded and its failure names the signature's refusal."""
    gen = _pending(host, signed, kernel)
    for cert in host.trusted.iterdir():
        cert.unlink()
    fake = FakeKernel()
    b = boot_with(host, fake).run().bundle("test")
    assert (b.phase, b.active) == (Phase.FAILED, None)
    failed = b.generations[gen].failed
    assert failed is not None
    assert failed.startswith("modules/ms_exporter.ko: ENOKEY: no trusted certificate has key id")
    assert not [c for c in fake.calls if c[0] == "load"]


@pytest.mark.parametrize(
    ("damage", "said"),
    [("invalid", "the generation's manifest is invalid: "), ("missing", "cannot read the ")],
)
def test_a_generation_whose_stored_manifest_is_damaged_fails_alone(
    host: Layout, signed: dict[str, Path], kernel: str, damage: str, said: str
) -> None:
    """A generation whose manifest in the store cannot be read or parsed fails with the
    reason (nothing of it is loaded), and boot goes on: the bundle's other generation, the
    active one, is brought back."""
    good = _pending(host, signed, kernel)
    boot_with(host, FakeKernel()).run()
    stage(host.incoming, bundle="test", version="2", kernel=kernel,
          modules=[ModuleSpec(signed["ms_params"], "")])  # fmt: skip
    [outcome] = make_intake(host).run()
    bad = str(outcome.generation)
    manifest = host.store / bad / "manifest.toml"
    manifest.parent.chmod(0o755)
    if damage == "invalid":
        manifest.chmod(0o644)
        manifest.write_bytes(b"not = [toml")
    else:
        manifest.unlink()
    fake = FakeKernel()
    b = boot_with(host, fake).run().bundle("test")
    assert (b.phase, b.active, b.pending) == (Phase.ACTIVE, good, None)
    failed = b.generations[bad].failed
    assert failed is not None and said in failed, failed
    assert "ms_params" not in [c[1] for c in fake.calls]


def test_a_module_missing_from_the_store_fails_its_generation_saying_so(
    host: Layout, signed: dict[str, Path], kernel: str
) -> None:
    """A module file gone from the store (the store damaged behind modstage's back) fails
    its generation with the file and the system's words for it, nothing of the generation
    left loaded."""
    gen = _pending(host, signed, kernel)
    stored = host.store / gen / "modules" / "ms_consumer.ko"
    stored.parent.chmod(0o755)
    stored.unlink()
    fake = FakeKernel()
    b = boot_with(host, fake).run().bundle("test")
    assert (b.phase, b.active) == (Phase.FAILED, None)
    assert b.generations[gen].failed == "modules/ms_consumer.ko: No such file or directory"
    assert not fake.loaded()


def _consumer_alone(host: Layout, signed: dict[str, Path], kernel: str) -> str:
    """Take in ms_consumer alone (its imports come from ms_exporter, which the bundle does
    not carry) with the target's exports unknown and ``require_symbol_crcs = false``."""
    (modules_dir(host, kernel) / "build/Module.symvers").unlink()
    stage(host.incoming, bundle="test", version="1", kernel=kernel,
          modules=[ModuleSpec(signed["ms_consumer"], "")])  # fmt: skip
    [outcome] = make_intake(host, Config(require_symbol_crcs=False)).run()
    assert outcome.accepted, outcome.reasons
    return str(outcome.generation)


def test_a_dependency_outside_the_bundle_is_loaded_by_modprobe_first(
    host: Layout, signed: dict[str, Path], kernel: str
) -> None:
    """A module whose ``depends`` names a module neither live nor in its bundle (an in-tree
    one) has it loaded by ``modprobe`` before ``finit_module``: without that the kernel
    refuses the module's unresolved symbols (ENOENT) and the generation fails."""
    gen = _consumer_alone(host, signed, kernel)
    fake = FakeKernel(intree={"ms_exporter": None})
    b = boot_with(host, fake, require_symbol_crcs=False).run().bundle("test")
    assert (b.phase, b.active) == (Phase.ACTIVE, gen), b.generations[gen].failed
    assert fake.calls == [("modprobe", "ms_exporter"), ("load", "ms_consumer", "")]


def test_modprobe_is_asked_only_for_dependencies_not_live(
    host: Layout, signed: dict[str, Path], kernel: str
) -> None:
    """A dependency already live (loaded before this boot's turn) is never handed to
    ``modprobe`` (nor is one the bundle loads itself:
    ``test_a_generation_taken_in_with_unchecked_crcs_boots``): it runs only for what the
    kernel lacks."""
    trust = TrustStore.from_directory(host.trusted)
    with open(signed["ms_exporter"], "rb") as f:
        srcversion = verify_module(f, display="ms_exporter", trust=trust, kernel=kernel).srcversion
    gen = _consumer_alone(host, signed, kernel)
    fake = FakeKernel(live={"ms_exporter": srcversion})
    b = boot_with(host, fake, require_symbol_crcs=False).run().bundle("test")
    assert (b.phase, b.active) == (Phase.ACTIVE, gen), b.generations[gen].failed
    assert fake.calls == [("load", "ms_consumer", "")]


def test_a_digest_file_that_cannot_be_written_is_logged_and_the_boot_goes_on(
    host: Layout, signed: dict[str, Path], kernel: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A generation gone live whose digest file cannot be written (a full disk) stays live:
    the boot does not fail modules the kernel already runs, and logs the write's failure as
    an error naming the bundle and the error."""
    from structlog.testing import capture_logs

    from service.boot.persist import Durable

    def no_room(*args: object) -> None:
        raise OSError(errno.ENOSPC, "No space left on device")

    gen = _pending(host, signed, kernel)
    monkeypatch.setattr(Durable, "publish_digest", no_room)
    with capture_logs() as logs:
        b = boot_with(host, FakeKernel()).run().bundle("test")
    assert (b.phase, b.active) == (Phase.ACTIVE, gen)
    [unwritable] = [e for e in logs if e["event"] == "digest.unwritable"]
    assert (unwritable["bundle"], unwritable["log_level"]) == ("test", "error")
    assert unwritable["error"] == "[Errno 28] No space left on device"


def test_a_module_is_known_by_the_name_its_elf_registers_not_its_file_name(
    host: Layout, signed: dict[str, Path], kernel: str, tmp_path: Path
) -> None:
    """A module file named apart from the module it holds (``renamed-exporter.ko`` holding
    ``ms_exporter``, as ``nvidia-580.ko`` may hold ``nvidia``) is recorded live under the
    kernel's name: the name ``/sys/module`` shows it by, which later checks of what is
    live (a module found loaded, one that left the kernel) look up."""
    renamed = tmp_path / "renamed-exporter.ko"
    renamed.write_bytes(signed["ms_exporter"].read_bytes())
    stage(host.incoming, bundle="test", version="1", kernel=kernel,
          modules=[ModuleSpec(renamed, "")])  # fmt: skip
    [outcome] = make_intake(host).run()
    assert outcome.accepted, outcome.reasons
    fake = FakeKernel()
    b = boot_with(host, fake).run().bundle("test")
    assert (b.phase, b.active) == (Phase.ACTIVE, outcome.generation)
    assert [m.module for m in b.loaded] == ["ms_exporter"] == list(fake.loaded())

"""Intake on a temporary root with real modules signed by the kernel's sign-file."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest

from service.bundles.phase import Phase
from service.bundles.statefile import load
from service.config import Config
from service.intake.scan import Outcome
from service.layout import Layout, kernel_image, modules_dir
from stager.drop import ModuleSpec, stage
from tests.kmod import SigningKey, sign
from tests.service.fakes import FakeKeyring, make_intake


def _stage(
    layout: Layout, files: list[Path], kernel: str, version: str = "1", **kw: object
) -> Path:
    return stage(
        layout.incoming,
        bundle="test",
        version=version,
        kernel=kernel,
        modules=[ModuleSpec(f, "") for f in files],
        **kw,
    )  # type: ignore[arg-type]


def _status(layout: Layout) -> dict[str, object]:
    return json.loads((layout.status / "test.json").read_text())


def test_drop_becomes_a_pending_read_only_generation(
    host: Layout, signed: dict[str, Path], kernel: str
) -> None:
    """A good drop is copied, verified, published read-only, recorded pending, and removed;
    the time it took is the outcome's and the log's (in milliseconds)."""
    from structlog.testing import capture_logs

    drop = _stage(host, [signed["ms_exporter"], signed["ms_consumer"]], kernel)
    with capture_logs() as logs:
        [outcome] = make_intake(host).run()
    assert outcome.accepted, outcome.reasons
    assert 0 < outcome.seconds < 60
    [accepted] = [e for e in logs if e["event"] == "drop.accepted"]
    assert accepted["ms"] == round(outcome.seconds * 1000)
    state = load(host.state).bundle("test")
    assert state.phase is Phase.PENDING and state.pending == outcome.generation
    generation = host.store / str(outcome.generation)
    assert sorted(p.name for p in (generation / "modules").iterdir()) == [
        "ms_consumer.ko",
        "ms_exporter.ko",
    ]
    assert all(not p.stat().st_mode & 0o222 for p in generation.rglob("*"))
    assert not drop.exists()
    assert _status(host)["phase"] == "pending"
    assert [p.name for p in host.store.iterdir()] == [outcome.generation]


def test_every_file_an_intake_persists_is_fsynced_before_its_directory(
    host: Layout, signed: dict[str, Path], kernel: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each file an intake leaves (the copied modules, the generation's manifest and the names
    its modules register, state.json, the status file) was fsynced (its inode, whatever name it had then), and after it the
    directory that holds it, up to the store itself, whose new entry is durable before the
    state that names it: a power cut after the intake loses none, and at no moment leaves a
    state naming a generation the store lost."""
    synced: list[int] = []
    real = os.fsync

    def fsync(fd: int) -> None:
        synced.append(os.fstat(fd).st_ino)
        real(fd)

    monkeypatch.setattr(os, "fsync", fsync)  # the standard library's, recorded
    _stage(host, [signed["ms_exporter"], signed["ms_consumer"]], kernel)
    [outcome] = make_intake(host).run()
    assert outcome.accepted, outcome.reasons
    generation = host.store / str(outcome.generation)
    files = sorted(p for p in generation.rglob("*") if p.is_file())
    assert [p.relative_to(generation).as_posix() for p in files] == [
        "manifest.toml",
        "modules/ms_consumer.ko",
        "modules/ms_exporter.ko",
        "registered.json",
    ]
    for path in [*files, host.state, host.status / "test.json", generation]:
        assert path.stat().st_ino in synced, path
        after = synced[synced.index(path.stat().st_ino) :]
        assert path.parent.stat().st_ino in after, f"{path.parent} not fsynced after {path}"
    published = synced.index(generation.stat().st_ino)
    store = synced.index(host.store.stat().st_ino, published)
    state = len(synced) - 1 - synced[::-1].index(host.state.stat().st_ino)  # its last write
    assert store < state, "state.json durable before the store"


def test_same_drop_twice_is_the_same_generation(
    host: Layout, signed: dict[str, Path], kernel: str
) -> None:
    """Taking in identical drops yields one generation and one history entry."""
    _stage(host, [signed["ms_exporter"]], kernel)
    [first] = make_intake(host).run()
    _stage(host, [signed["ms_exporter"]], kernel)
    [second] = make_intake(host).run()
    assert first.generation == second.generation
    assert len(load(host.state).bundle("test").history) == 1


def test_untrusted_signature_is_rejected_and_changes_nothing(
    host: Layout,
    modules: dict[str, Path],
    other_key: SigningKey,
    signed: dict[str, Path],
    kernel: str,
    tmp_path: Path,
) -> None:
    """A module signed by an unknown key: rejected with the reason, naming the module where
    the admin finds it (under the quarantine, not the incoming path it left); state and
    store untouched."""
    _stage(host, [signed["ms_exporter"]], kernel)
    make_intake(host).run()
    before = host.state.read_bytes()
    store_before = sorted(host.store.iterdir())
    bad = sign(modules["ms_params"], other_key, tmp_path / "ms_params.ko")
    drop = _stage(host, [bad], kernel, version="2")
    [outcome] = make_intake(host).run()
    assert not outcome.accepted
    assert "ENOKEY" in outcome.reasons[0]
    assert outcome.reasons[0].startswith(f"{host.quarantine / drop.name}/modules/ms_params.ko: ")
    assert (host.quarantine / drop.name / "modules/ms_params.ko").exists()
    assert host.state.read_bytes() == before
    assert sorted(host.store.iterdir()) == store_before
    status = _status(host)
    assert status["phase"] == "rejected" and status["errors"] == list(outcome.reasons)
    assert not drop.exists()


def test_vermagic_for_another_kernel_is_rejected(
    host: Layout, signed: dict[str, Path], kernel: str
) -> None:
    """A manifest claiming another installed kernel (its module tree and config here, a
    build without modversions: its same_magic compares the release too) than the modules'
    vermagic is judged against that kernel and refused for the release: not deferred, as a
    drop for a kernel whose tree is missing is."""
    other = "6.12.0-1-amd64"
    shutil.copytree(modules_dir(host, kernel), host.root / "lib/modules" / other)
    config = (host.root / "boot" / f"config-{kernel}").read_text()
    unset = "CONFIG_MODVERSIONS=n\n"  # the last line of an option wins
    (host.root / "boot" / f"config-{other}").write_text(config + unset)
    _stage(host, [signed["ms_exporter"]], other)
    [outcome] = make_intake(host).run()
    assert not outcome.accepted and not outcome.deferred
    assert any(f"vermagic is for kernel {kernel}, not {other}" in r for r in outcome.reasons), (
        outcome.reasons
    )


@pytest.mark.parametrize(
    ("plant", "reason"),
    [
        (lambda p: (p.unlink(), p.symlink_to("/etc/passwd")), "is a symbolic link"),
        (lambda p: (p.unlink(), os.mkfifo(p)), "is a FIFO, not a regular file"),
        (lambda p: os.link(p, p.parent.parent / "extra-link"), "has 2 hard links"),
    ],
    ids=["symlink", "fifo", "hardlink"],
)
def test_unsafe_files_are_rejected(
    host: Layout, signed: dict[str, Path], kernel: str, plant: object, reason: str
) -> None:
    """Symlinks, FIFOs and hard-linked files in a drop are refused, naming the file."""
    drop = _stage(host, [signed["ms_exporter"]], kernel)
    plant(drop / "modules" / "ms_exporter.ko")  # type: ignore[operator]
    [outcome] = make_intake(host).run()
    kept = host.quarantine / drop.name  # the reason names where the admin finds the file
    assert outcome.reasons[0].startswith(f"{kept}/modules/ms_exporter.ko: {reason}")
    assert not host.state.exists()


def test_host_policy_narrows_what_a_bundle_may_ask(
    host: Layout, signed: dict[str, Path], kernel: str
) -> None:
    """Bundle names, memory policies and parameters the host forbids are each reported."""
    config = Config(
        allowed_bundles=("nvidia",), allowed_memory_policies=(), forbidden_params=("NVreg_Debug",)
    )
    stage(
        host.incoming,
        bundle="test",
        version="1",
        kernel=kernel,
        memory="online",
        modules=[ModuleSpec(signed["ms_exporter"], "NVreg-Debug=1")],
    )
    [outcome] = make_intake(host, config).run()
    assert outcome.reasons == (
        "bundle 'test' is not allowed on this host",
        "memory policy 'online' is not allowed on this host",
        "module[0].params: 'NVreg-Debug' is forbidden on this host",
    )


def test_preflight_asks_the_enforcing_kernel(
    host: Layout, signed: dict[str, Path], kernel: str
) -> None:
    """With sig_enforce=Y, a signer missing from the kernel's keyrings is rejected up front,
    named by key id and subject, with the remedy: its trusted certificate as a MOK."""
    enforce = host.sys / "module/module/parameters/sig_enforce"
    enforce.parent.mkdir(parents=True)
    enforce.write_text("Y\n")
    _stage(host, [signed["ms_exporter"]], kernel)
    keyring = FakeKeyring(set())
    [outcome] = make_intake(host, keyring=keyring).run()
    assert not outcome.accepted
    [reason] = outcome.reasons
    [certificate] = [p for p in host.trusted.iterdir() if p.suffix == ".pem"]
    assert reason.startswith(
        f"EKEYREJECTED: the running kernel (module.sig_enforce=1) does "
        f"not trust signing key {keyring.asked[0]} ("
    )
    assert f"): enroll it as a MOK: mokutil --import {certificate}, then reboot" in reason
    _stage(host, [signed["ms_exporter"]], kernel)
    [outcome] = make_intake(host, keyring=FakeKeyring(set(keyring.asked))).run()
    assert outcome.accepted


def test_old_generations_are_collected_but_not_active_or_pending(
    host: Layout, signed: dict[str, Path], kernel: str
) -> None:
    """With retain=2, only the newest two generations remain, plus active and pending."""
    from dataclasses import replace

    from service.bundles.statefile import save

    ids = []
    for version in "12345":
        _stage(host, [signed["ms_exporter"]], kernel, version=version)
        [o] = make_intake(host, Config(retain=2)).run()
        ids.append(o.generation)
        if version == "1":  # pretend generation 1 booted fine: it is the last known good
            state = load(host.state)
            b = state.bundle("test")
            b = replace(b.move(Phase.LOADING).move(Phase.ACTIVE), active=o.generation, pending=None)
            save(host.state, state.with_bundle("test", b))
    kept = sorted(p.name for p in host.store.iterdir())
    assert kept == sorted([ids[0], ids[3], ids[4]])
    assert set(load(host.state).bundle("test").generations) == set(kept)


@pytest.mark.parametrize("require", [True, False])
def test_without_any_export_list_the_config_decides_about_unknown_crcs(
    host: Layout, signed: dict[str, Path], kernel: str, require: bool
) -> None:
    """With neither the target's image nor its build/Module.symvers (the exports cannot be
    read), a module importing symbols whose CRCs are unknown is refused as a named policy by
    default, and taken in when ``require_symbol_crcs = false`` accepts unchecked CRCs."""
    assert not kernel_image(host, kernel).exists()
    (host.root / "lib/modules" / kernel / "build/Module.symvers").unlink()
    _stage(host, [signed["ms_exporter"], signed["ms_consumer"]], kernel)
    [outcome] = make_intake(host, Config(require_symbol_crcs=require)).run()
    if require:
        assert not outcome.accepted
        assert any("(policy)" in r and "known exports" in r for r in outcome.reasons), outcome
    else:
        assert outcome.accepted, outcome.reasons


def test_require_symbol_crcs_must_be_a_boolean() -> None:
    """The config key is validated like every other: a string is a named problem."""
    from service.errors import ConfigError

    with pytest.raises(ConfigError, match="require_symbol_crcs: 'no' is not a boolean"):
        Config.from_dict({"require_symbol_crcs": "no"})


def test_a_drop_that_cannot_be_removed_is_taken_in_once(
    host: Layout, signed: dict[str, Path], kernel: str
) -> None:
    """A drop taken in that can be neither removed nor quarantined (here a read-only
    mount, with the quarantine unwritable too) is not taken in again on every scan: it is
    remembered, logged once, and its bundle's status file names it."""
    import subprocess

    from structlog.testing import capture_logs

    drop = _stage(host, [signed["ms_exporter"]], kernel)
    host.quarantine.parent.mkdir(parents=True, exist_ok=True)
    host.quarantine.write_text("not a directory")  # the quarantine cannot record it
    subprocess.run(["mount", "--bind", str(drop), str(drop)], check=True)
    try:
        subprocess.run(["mount", "-o", "remount,bind,ro", str(drop)], check=True)
        intake = make_intake(host)
        with capture_logs() as logs:
            [first] = intake.run()
            again = intake.run()
            later = intake.run()
    finally:
        subprocess.run(["umount", "-l", str(drop)], check=False)
    assert first.accepted and (drop / "manifest.toml").exists()
    assert again == [] and later == []
    stuck = [e for e in logs if e["event"] == "drop.stuck"]
    assert len(stuck) == 1 and stuck[0]["drop"] == drop.name
    assert [e["event"] for e in logs].count("drop.accepted") == 1
    status = _status(host)
    assert status["phase"] == "pending" and drop.name in str(status["errors"])
    assert "stays in place" in str(status["errors"])


def test_a_rejected_drop_left_in_place_is_skipped_by_a_later_intake(
    host: Layout, modules: dict[str, Path], kernel: str
) -> None:
    """A rejected drop that can be neither moved nor removed (a read-only mount) is logged
    as unremovable and recorded in the quarantine as left in place; an intake started later
    (nothing remembered in memory) reads that record and skips the drop: no second
    rejection, no second record."""
    import subprocess

    from structlog.testing import capture_logs

    from service.publish import quarantine

    drop = _stage(host, [modules["ms_params"]], kernel)  # unsigned: rejected
    subprocess.run(["mount", "--bind", str(drop), str(drop)], check=True)
    try:
        subprocess.run(["mount", "-o", "remount,bind,ro", str(drop)], check=True)
        with capture_logs() as logs:
            [first] = make_intake(host).run()
        [record] = quarantine.records(host)
        with capture_logs() as later_logs:
            later = make_intake(host).run()
    finally:
        subprocess.run(["umount", "-l", str(drop)], check=False)
    assert not first.accepted and (drop / "manifest.toml").exists()
    assert record.drop == drop.name and record.left == str(drop)
    unremovable = [e for e in logs if e["event"] == "drop.unremovable"]
    assert unremovable and unremovable[0]["drop"] == drop.name
    assert later == []
    assert not [e for e in later_logs if e["event"] == "drop.rejected"]
    assert quarantine.records(host) == [record]


def test_a_store_that_cannot_be_cleaned_is_logged_and_the_drop_taken_in(
    host: Layout, signed: dict[str, Path], kernel: str
) -> None:
    """What a killed intake left in the store is removed before each run; when that fails
    (here a leftover temporary directory on a read-only mount), the error is logged and the
    run goes on: the drop is taken in."""
    import subprocess

    from structlog.testing import capture_logs

    from service.generations.store import TMP_PREFIX

    leftover = host.store / f"{TMP_PREFIX}killed"
    leftover.mkdir(parents=True)
    (leftover / "half").write_bytes(b"half a copy")
    _stage(host, [signed["ms_exporter"]], kernel)
    subprocess.run(["mount", "--bind", str(leftover), str(leftover)], check=True)
    try:
        subprocess.run(["mount", "-o", "remount,bind,ro", str(leftover)], check=True)
        with capture_logs() as logs:
            [outcome] = make_intake(host).run()
    finally:
        subprocess.run(["umount", "-l", str(leftover)], check=False)
    assert outcome.accepted, outcome.reasons
    [failed] = [e for e in logs if e["event"] == "store.clean_failed"]
    assert failed["log_level"] == "error" and leftover.name in failed["error"], failed


def test_an_unforeseen_error_rejects_the_drop_for_its_bundle(
    host: Layout, signed: dict[str, Path], kernel: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Whatever a drop makes go wrong is never fatal: an error nobody foresaw (here raised
    while reading the manifest) rejects the drop naming the error, under the bundle its
    directory name gives, and the bundle's status file says so."""
    from service.intake.scan import Intake

    drop = _stage(host, [signed["ms_exporter"]], kernel)

    def broken(self: Intake, drop: Path) -> None:
        raise RuntimeError("unforeseen")

    monkeypatch.setattr(Intake, "_manifest", broken)
    [outcome] = make_intake(host).run()
    assert not outcome.accepted and not outcome.deferred
    assert (outcome.bundle, outcome.reasons) == (
        "test", ("cannot be taken in: RuntimeError: unforeseen",)
    )  # fmt: skip
    assert "RuntimeError: unforeseen" in str(_status(host)["errors"])
    assert not drop.exists()


def test_a_drop_whose_manifest_cannot_be_read_is_rejected_for_the_bundle_it_names(
    host: Layout, signed: dict[str, Path], kernel: str
) -> None:
    """Before its manifest is read a drop is known only by its directory name: a manifest
    that is not TOML rejects the drop under the bundle that name gives, whose status file
    then says why."""
    drop = _stage(host, [signed["ms_exporter"]], kernel)
    (drop / "manifest.toml").write_bytes(b"not = [toml")
    [outcome] = make_intake(host).run()
    assert not outcome.accepted and outcome.bundle == "test"
    assert _status(host)["phase"] == "rejected"


def test_a_bundles_first_drop_shows_verifying_while_it_is_checked(
    host: Layout, signed: dict[str, Path], kernel: str
) -> None:
    """While a drop is copied and verified, its bundle's status file says so (phase
    verifying, naming the generation the drop would become), for a bundle state.json does
    not know yet too."""
    _stage(host, [signed["ms_exporter"]], kernel)
    intake = make_intake(host)
    seen: list[dict[str, object]] = []
    intake.building = lambda drop: seen.append(_status(host)) if drop is not None else None
    [outcome] = intake.run()
    assert outcome.accepted, outcome.reasons
    assert [(s["phase"], s["generation"]) for s in seen] == [("verifying", outcome.generation)]


@pytest.mark.parametrize(("provider", "accepted"), [("ms_exporter", True), ("ms_params", False)])
def test_imports_from_a_bundle_loaded_before_are_judged_with_its_exports(
    host: Layout, signed: dict[str, Path], kernel: str, provider: str, accepted: bool
) -> None:
    """A drop whose bundle loads after another (``after``) is judged with the exports of
    that bundle's pending generation, as the kernel will see them: ms_consumer after a
    bundle of ms_exporter is taken in; after a bundle that does not export its imports it is
    refused at intake, not left for a boot to fail."""
    stage(host.incoming, bundle="a-first", version="1", kernel=kernel,
          modules=[ModuleSpec(signed[provider], "")])  # fmt: skip
    [first] = make_intake(host).run()
    assert first.accepted, first.reasons
    stage(host.incoming, bundle="b-then", version="1", kernel=kernel,
          modules=[ModuleSpec(signed["ms_consumer"], "")], after=("a-first",))  # fmt: skip
    [then] = make_intake(host).run()
    assert then.accepted == accepted, then.reasons
    if not accepted:
        assert "ms_consumer" in " ".join(then.reasons)


def _live_then_refused(
    host: Layout,
    modules: dict[str, Path],
    other_key: SigningKey,
    signed: dict[str, Path],
    kernel: str,
    tmp_path: Path,
    *,
    unload: bool,
    hold: bool = False,
) -> tuple[bytes, Outcome]:
    """v1 taken in and booted (its modules live in the sysfs tree), held by an admin if
    asked, its modules unloaded if asked; then a v2 drop signed by an untrusted key, taken
    in. The state file's bytes before the refusal, and the refusal."""
    from service.bundles import verbs
    from service.bundles.statefile import save
    from tests.service.fakes import FakeKernel, boot_with

    _stage(host, [signed["ms_exporter"]], kernel, config_digest="digest-1")
    make_intake(host).run()
    kernel_view = FakeKernel(sys=host.sys)
    boot_with(host, kernel_view).run()
    if hold:
        state = load(host.state)
        save(host.state, state.with_bundle("test", verbs.hold(state.bundle("test"))))
    if unload:
        for name in list(kernel_view.live):
            kernel_view.unload(name)
    before = host.state.read_bytes()
    bad = sign(modules["ms_params"], other_key, tmp_path / "ms_params.ko")
    drop = _stage(host, [bad], kernel, version="2", config_digest="digest-2")
    [outcome] = make_intake(host).run()
    status = _status(host)
    if hold:  # a held bundle's drop waits in incoming, never quarantined
        assert not outcome.accepted and outcome.deferred
        assert "held by an admin" in outcome.reasons[0]
        assert drop.is_dir() and not (host.quarantine / drop.name).exists()
        assert status["errors"] == list(outcome.reasons) and status["drop"] == drop.name
        return before, outcome
    assert not outcome.accepted and "ENOKEY" in outcome.reasons[0]
    assert not drop.exists() and (host.quarantine / drop.name).exists()
    assert status["phase"] == "rejected" and status["errors"] == list(outcome.reasons)
    return before, outcome


def test_a_refused_drop_after_an_unload_makes_the_active_generation_pending_again(
    host: Layout,
    modules: dict[str, Path],
    other_key: SigningKey,
    signed: dict[str, Path],
    kernel: str,
    tmp_path: Path,
) -> None:
    """The active generation's modules left the kernel, then a drop is refused: the drop is
    quarantined and its status says rejected with the reasons, as for any refusal, and the
    active generation is pending again (a reboot awaited), the refused drop recorded with
    the version and digest it carried; ``status`` says the last good one is reloaded."""
    from service.status.collect import collect

    _, outcome = _live_then_refused(host, modules, other_key, signed, kernel, tmp_path, unload=True)
    state = load(host.state)
    b = state.bundle("test")
    assert (b.phase, b.pending) == (Phase.PENDING, b.active) and b.active is not None
    assert state.awaiting_reboot(kernel) == ["test"]
    assert b.refused is not None and (b.refused.version, b.refused.digest) == ("2", "digest-2")
    assert b.refused.reason.startswith("modules/ms_params.ko: ENOKEY")
    [reason] = [r for r in collect(host).bundles["test"].reasons if "rejected" in r]
    assert outcome.reasons[0] in reason
    assert f"the last good generation {b.active[:12]} (1) is loaded again" in reason


def test_a_refused_drop_while_the_modules_are_loaded_changes_no_state(
    host: Layout,
    modules: dict[str, Path],
    other_key: SigningKey,
    signed: dict[str, Path],
    kernel: str,
    tmp_path: Path,
) -> None:
    """The active generation's modules are live: a refused drop leaves state.json as it
    was, byte for byte (no generation pending, no reboot awaited)."""
    before, _ = _live_then_refused(host, modules, other_key, signed, kernel, tmp_path, unload=False)
    assert host.state.read_bytes() == before
    assert load(host.state).awaiting_reboot(kernel) == []


def test_a_held_bundle_keeps_its_drop_waiting_and_is_not_reloaded(
    host: Layout,
    modules: dict[str, Path],
    other_key: SigningKey,
    signed: dict[str, Path],
    kernel: str,
    tmp_path: Path,
) -> None:
    """An admin holds the bundle: after an unload a new drop (even one verification would
    refuse) is neither verified nor quarantined: it waits in incoming, its status file says
    it waits for release, and no state changes (no reboot is asked while held)."""
    before, _ = _live_then_refused(
        host, modules, other_key, signed, kernel, tmp_path, unload=True, hold=True
    )
    assert host.state.read_bytes() == before
    assert load(host.state).awaiting_reboot(kernel) == []


def test_the_daemons_rejection_reads_the_digest_the_drop_carried(
    host: Layout, signed: dict[str, Path], kernel: str
) -> None:
    """The daemon's rejection (of the drop an intake child was killed on) knows no manifest:
    it reads the drop's config digest itself, so the reload it starts publishes that one."""
    from service.config import Config
    from service.intake.drops import Drops
    from service.intake.rejection import reject
    from tests.service.fakes import FakeKernel, boot_with

    _stage(host, [signed["ms_exporter"]], kernel)
    make_intake(host).run()
    kernel_view = FakeKernel(sys=host.sys)
    boot_with(host, kernel_view).run()
    for name in list(kernel_view.live):
        kernel_view.unload(name)
    drop = _stage(host, [signed["ms_params"]], kernel, version="2", config_digest="digest-2")
    outcome = reject(host, Config(), Drops(host, Config()), drop, "test", [f"{drop}: killed"])
    b = load(host.state).bundle("test")
    assert not outcome.accepted and (b.phase, b.pending) == (Phase.PENDING, b.active)
    assert b.refused is not None and (b.refused.version, b.refused.digest) == (None, "digest-2")
    assert b.refused.reason == "killed"


def test_an_incoming_directory_that_cannot_be_listed_takes_nothing_and_says_why(
    host: Layout,
) -> None:
    """When the incoming directory cannot be listed (a file in its place), a run takes in
    nothing, does not raise, and logs ``scan.failed`` naming the directory."""
    from structlog.testing import capture_logs

    host.incoming.rmdir()
    host.incoming.write_text("not a directory")
    with capture_logs() as logs:
        assert make_intake(host).run() == []
    [failed] = [e for e in logs if e["event"] == "scan.failed"]
    assert failed["incoming"] == str(host.incoming) and failed["log_level"] == "error"


def test_an_intake_leaves_no_descriptor_open(
    host: Layout,
    modules: dict[str, Path],
    other_key: SigningKey,
    signed: dict[str, Path],
    kernel: str,
    tmp_path: Path,
) -> None:
    """Every descriptor an intake opens on a drop (its manifest's directory, its digest's,
    the copy's) is closed again, whether the drop is accepted or rejected after its copy was
    verified: a daemon that takes in drops for months never runs out of descriptors."""
    fds = Path("/proc/self/fd")
    make_intake(host).run()  # whatever a first run opens for good
    before = sorted(p.name for p in fds.iterdir())
    _stage(host, [signed["ms_exporter"]], kernel)
    [accepted] = make_intake(host).run()
    assert accepted.accepted, accepted.reasons
    bad = sign(modules["ms_params"], other_key, tmp_path / "ms_params.ko")
    _stage(host, [bad], kernel, version="2")
    [rejected] = make_intake(host).run()
    assert "ENOKEY" in rejected.reasons[0]
    assert sorted(p.name for p in fds.iterdir()) == before


def test_a_status_unwritable_after_a_host_error_is_logged_and_the_drop_kept(
    host: Layout, signed: dict[str, Path], kernel: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A drop the host could not take in (the store's copy fails) whose status file cannot be
    written either (the disk that failed the copy fails this too) is still deferred and kept
    in incoming, and the status write's failure is logged as an error naming the bundle and
    the error: the intake goes on, and the admin reads why in the log."""
    import errno

    from structlog.testing import capture_logs

    import service.intake.scan as intake_module
    from service.generations.store import Store

    def no_room(*args: object, **kwargs: object) -> None:
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(Store, "copy_drop", no_room)
    monkeypatch.setattr(intake_module, "write_status", no_room)
    drop = _stage(host, [signed["ms_exporter"]], kernel)
    with capture_logs() as logs:
        [outcome] = make_intake(host).run()
    assert outcome.deferred and not outcome.accepted and drop.is_dir()
    [unwritable] = [e for e in logs if e["event"] == "status.unwritable"]
    assert (unwritable["bundle"], unwritable["log_level"]) == ("test", "error")
    assert "No space left on device" in unwritable["error"]


def test_a_bundle_loaded_before_whose_generation_left_the_store_counts_as_unknown(
    host: Layout, signed: dict[str, Path], kernel: str
) -> None:
    """A drop loading after a bundle whose generation state names but the store no longer
    holds (removed behind modstage's back) is judged as one loading after a bundle with no
    generation yet, its exports unknown: taken in, never deferred run after run on the
    missing directory."""
    stage(host.incoming, bundle="a-first", version="1", kernel=kernel,
          modules=[ModuleSpec(signed["ms_exporter"], "")])  # fmt: skip
    [first] = make_intake(host).run()
    gone = host.store / str(first.generation)
    for p in [gone, *gone.rglob("*")]:
        p.chmod(0o755)
    shutil.rmtree(gone)
    stage(host.incoming, bundle="b-then", version="1", kernel=kernel,
          modules=[ModuleSpec(signed["ms_consumer"], "")], after=("a-first",))  # fmt: skip
    [then] = make_intake(host).run()
    assert then.accepted and not then.deferred, then.reasons

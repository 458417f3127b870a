"""The admin's verbs on a temporary host: each through the state machine, under the lock."""

from __future__ import annotations

import io
import json
import shutil
import threading
import time
from pathlib import Path

import pytest

from service.bundles.phase import Phase
from service.bundles.records import ModuleLoad
from service.bundles.state import BundleState, Generation, State
from service.bundles.statefile import load, locked, read, save
from service.cli import main
from service.generations.store import Store
from service.layout import Layout
from service.parser import build_parser
from stager.schema.manifest import Manifest, ModuleEntry
from stager.schema.paths import MANIFEST_NAME
from tests.hosts import running_host
from tests.kmod import SigningKey

KERNEL = "6.1.0-test"


def manifest(version: str) -> Manifest:
    """A manifest for bundle nvidia at ``version``."""
    return Manifest("nvidia", version, KERNEL, (ModuleEntry("m.ko", "0" * 64),))


def put_in_store(layout: Layout, m: Manifest) -> str:
    """Publish ``m`` in the store (only its manifest: enough for the verbs)."""
    path = Store(layout.store).path(m.digest)
    path.mkdir(parents=True)
    (path / MANIFEST_NAME).write_bytes(m.to_toml())
    return m.digest


def failed_upgrade(layout: Layout) -> tuple[str, str, str]:
    """v1 then v2 active in turn, then v3 failed at boot (ENOKEY) and v2 came up again."""
    ids = [put_in_store(layout, manifest(v)) for v in ("1", "2", "3")]
    b = BundleState()
    for i, gid in enumerate(ids[:2]):
        b = b.with_generation(Generation(gid, str(i + 1), KERNEL, added=100.0 * (i + 1)))
        b = b.move(Phase.PENDING, pending=gid).move(Phase.LOADING)
        b = b.move(Phase.ACTIVE, active=gid, pending=None)
    b = b.with_generation(Generation(ids[2], "3", KERNEL, added=300.0))
    b = b.move(Phase.PENDING, pending=ids[2]).move(Phase.LOADING)
    bad = Generation(ids[2], "3", KERNEL, added=300.0, attempts=1, failed="ENOKEY: key unknown")
    b = b.with_generation(bad).move(Phase.FAILED, pending=None, note="ENOKEY")
    loads = (ModuleLoad("m", None, ms=1.0),)  # the fallback came up
    b = b.move(Phase.LOADING).move(Phase.ACTIVE, active=ids[1], loaded=loads)
    save(layout.state, State({"nvidia": b}))
    return ids[0], ids[1], ids[2]


@pytest.fixture
def layout(tmp_path: Path) -> Layout:
    """A host tree with a running kernel."""
    return running_host(tmp_path, KERNEL, boot_id=None)


def cli(layout: Layout, *argv: str) -> tuple[int, str]:
    """Run ``modstage`` with ``--root`` and return (exit code, stdout)."""
    out = io.StringIO()
    code = main([argv[0], "--root", str(layout.root), *argv[1:]], out)
    return code, out.getvalue()


def test_generations_lists_roles_in_json(layout: Layout) -> None:
    """``generations --json`` shows every generation with version, added in UTC and its roles."""
    v1, v2, v3 = failed_upgrade(layout)
    code, out = cli(layout, "generations", "nvidia", "--json")
    rows = {r["id"]: r for r in json.loads(out)}
    assert code == 0 and set(rows) == {v1, v2, v3}
    assert rows[v2]["roles"] == ["active", "last-known-good"]
    assert rows[v3]["roles"] == ["failed"] and rows[v3]["failed"] == "ENOKEY: key unknown"
    assert rows[v1]["roles"] == ["retained"] and rows[v1]["added_utc"] == "1970-01-01T00:01:40Z"
    assert rows[v1]["added"] == 100.0 and rows[v2]["role"] == "active"
    code, text = cli(layout, "generations")
    assert code == 0 and "[active,last-known-good]" in text and v3[:12] in text
    assert cli(layout, "generations", "amd")[0] == 2  # an unknown bundle is a usage error


def test_a_generation_is_one_record_in_status_and_generations(layout: Layout) -> None:
    """``status --json`` and ``generations --json`` describe a generation with the same keys
    and values (``added`` epoch seconds, ``added_utc``, ``role`` and ``roles``);
    ``generations`` adds only its bundle, whether the store has it, and the hold."""
    failed_upgrade(layout)
    _code, out = cli(layout, "generations", "nvidia", "--json")
    listed = {r["id"]: r for r in json.loads(out)}
    _code, out = cli(layout, "status", "--json")
    shown = {g["id"]: g for g in json.loads(out)["bundles"]["nvidia"]["generations"]}
    assert listed.keys() == shown.keys() and len(listed) == 3
    for gen_id, row in listed.items():
        extra = {k: row.pop(k) for k in ("bundle", "in_store", "held")}
        assert row == shown[gen_id] and extra["bundle"] == "nvidia"


def test_retry_clears_the_failure_and_makes_it_pending(layout: Layout) -> None:
    """retry: the failed generation is pending again with no attempts, recorded in history."""
    _v1, v2, v3 = failed_upgrade(layout)
    code, out = cli(layout, "retry", "nvidia", "--json")
    assert code == 0 and json.loads(out)["pending"] == v3
    b = load(layout.state).bundle("nvidia")
    assert b.phase is Phase.PENDING and b.pending == v3 and b.active == v2
    assert b.generations[v3].failed is None and b.generations[v3].attempts == 0
    assert b.history[-1].note.startswith(f"admin: retry {v3[:12]}")
    assert load(layout.state).awaiting_reboot(KERNEL) == ["nvidia"]
    status = json.loads((layout.status / "nvidia.json").read_text())
    assert status["pending"] == v3 and status["failed"] == {}
    assert cli(layout, "retry", "nvidia")[0] == 1  # nothing failed any more


def test_retry_refuses_a_generation_gone_from_the_store(layout: Layout) -> None:
    """A failed generation no longer in the store cannot be retried; state is unchanged."""
    _v1, _v2, v3 = failed_upgrade(layout)
    Store(layout.store).collect([v3])
    before = layout.state.read_bytes()
    assert cli(layout, "retry", "nvidia", v3[:12])[0] == 1
    assert layout.state.read_bytes() == before


def test_rollback_defaults_to_the_generation_before_the_active(layout: Layout) -> None:
    """rollback: the generation before the active one becomes pending; a failed one is refused."""
    v1, v2, v3 = failed_upgrade(layout)
    assert cli(layout, "rollback", "nvidia", v3[:10])[0] == 1  # failed: use retry
    assert cli(layout, "rollback", "nvidia", v2)[0] == 1  # already active
    code, out = cli(layout, "rollback", "nvidia")
    assert code == 0 and v1[:12] in out
    b = load(layout.state).bundle("nvidia")
    assert b.pending == v1 and b.active == v2 and b.phase is Phase.PENDING
    assert b.history[-1].note == f"admin: rollback to {v1[:12]} (1)"


def test_a_pending_rollback_can_be_cancelled_and_is_recorded_once(layout: Layout) -> None:
    """A rollback repeated is refused (exit 1) and not recorded twice; ``rollback`` to the
    active generation cancels the pending one: active again, nothing pending, one history
    note naming both, and the cancelled generation is kept (retained)."""
    v1, v2, _v3 = failed_upgrade(layout)
    assert cli(layout, "rollback", "nvidia", v1[:12])[0] == 0
    notes = len(load(layout.state).bundle("nvidia").history)
    assert cli(layout, "rollback", "nvidia", v1[:12])[0] == 1
    assert len(load(layout.state).bundle("nvidia").history) == notes
    code, out = cli(layout, "rollback", "nvidia", v2[:12])
    assert code == 0, out
    b = load(layout.state).bundle("nvidia")
    assert (b.phase, b.active, b.pending) == (Phase.ACTIVE, v2, None) and v1 in b.generations
    assert b.history[-1].note == (f"admin: rollback to active {v2[:12]} cancels pending {v1[:12]}")
    assert cli(layout, "rollback", "nvidia", v2[:12])[0] == 1  # nothing pending: already active


def test_hold_blocks_new_generations_and_reboots_until_release(layout: Layout) -> None:
    """hold: no reboot is required for a pending generation; release brings it back."""
    _v1, _v2, _v3 = failed_upgrade(layout)
    assert cli(layout, "retry", "nvidia")[0] == 0
    assert cli(layout, "hold", "nvidia", "--json")[0] == 0
    assert load(layout.state).awaiting_reboot(KERNEL) == []
    assert cli(layout, "hold", "nvidia")[0] == 1  # already held
    b = load(layout.state).bundle("nvidia")
    assert b.held and b.history[-1].note == "admin: hold" and b.phase is Phase.PENDING
    assert cli(layout, "release", "nvidia")[0] == 0
    assert load(layout.state).awaiting_reboot(KERNEL) == ["nvidia"]
    assert load(layout.state).bundle("nvidia").history[-1].note == "admin: release"


def test_prune_never_removes_active_or_pending(layout: Layout) -> None:
    """prune --keep 0 removes every generation but the active (last known good) and pending."""
    v1, v2, v3 = failed_upgrade(layout)
    assert cli(layout, "retry", "nvidia")[0] == 0
    code, out = cli(layout, "prune", "--keep", "0", "--json")
    assert code == 0 and json.loads(out)["removed"] == {"nvidia": [v1]}
    b = load(layout.state).bundle("nvidia")
    assert set(b.generations) == {v2, v3} and b.history[-1].note.startswith("admin: prune")
    store = Store(layout.store)
    assert not store.has(v1) and store.has(v2) and store.has(v3)
    code, out = cli(layout, "prune")
    assert code == 0 and "nothing to prune" in out


def test_a_verb_waits_for_the_state_lock(layout: Layout) -> None:
    """While another process (the daemon) holds the state lock, a verb does not write."""
    failed_upgrade(layout)
    done = threading.Event()

    def verb() -> None:
        cli(layout, "hold", "nvidia")
        done.set()

    with locked(layout.var):
        worker = threading.Thread(target=verb)
        worker.start()
        time.sleep(0.3)
        assert not done.is_set() and not read(layout.state).bundle("nvidia").held
    worker.join(5)
    assert done.is_set() and read(layout.state).bundle("nvidia").held


def test_an_unknown_bundle_is_a_clear_error(
    layout: Layout, capsys: pytest.CaptureFixture[str]
) -> None:
    """A verb on a bundle state does not know exits 2 (usage, as --help says) naming the
    known bundles."""
    failed_upgrade(layout)
    assert cli(layout, "hold", "amd")[0] == 2
    assert "no bundle named 'amd'" in capsys.readouterr().err


def test_every_help_lists_exit_codes_and_version_prints(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """Each command's --help ends with its exit codes; ``--version`` prints the version."""
    parser = build_parser()
    names = [a for a in parser._subparsers._group_actions[0].choices]  # type: ignore[union-attr]
    assert {"generations", "retry", "rollback", "hold", "release", "prune", "config"} <= set(names)
    for name in names:
        with pytest.raises(SystemExit):
            main([name, "--help"])
        assert "exit codes: 0" in capsys.readouterr().out, name
    with pytest.raises(SystemExit):
        main(["config", "check", "--help"])
    assert "exit codes: 0" in capsys.readouterr().out
    with pytest.raises(SystemExit) as info:
        main(["--version"])
    assert info.value.code == 0 and capsys.readouterr().out.startswith("modstage ")


def test_wait_help_describes_every_option(capsys: pytest.CaptureFixture[str]) -> None:
    """``wait --help`` says what each option is for."""
    with pytest.raises(SystemExit):
        main(["wait", "--help"])
    text = capsys.readouterr().out
    for words in ("bundle (slot) name", "generation id", "S >= 0", "exit codes"):
        assert words in text


def test_config_check_names_problems(layout: Layout, rsa_key: SigningKey) -> None:
    """config check: exit 1 naming a typo'd key and an empty trust directory; 0 when fine."""
    layout.etc.mkdir(parents=True)
    layout.config.write_text("max_boot_attempt = 3\n")
    out = io.StringIO()
    code = main(["config", "check", "--root", str(layout.root), "--json"], out)
    doc = json.loads(out.getvalue())
    assert code == 1 and not doc["ok"]
    assert any("max_boot_attempt: unknown key" in p for p in doc["problems"])
    assert any("trusted" in p for p in doc["problems"])
    layout.config.write_text("max_boot_attempts = 3\n")
    layout.trusted.mkdir()
    shutil.copy(rsa_key.cert_pem, layout.trusted / "k.pem")
    out = io.StringIO()
    assert main(["config", "check", "--root", str(layout.root)], out) == 0
    assert "modstage rsa" in out.getvalue() and out.getvalue().endswith("ok\n")


def test_a_corrupt_state_is_named_and_left_in_place(
    layout: Layout, capsys: pytest.CaptureFixture[str]
) -> None:
    """A verb on a garbled state.json names the file and does not move it aside."""
    failed_upgrade(layout)
    layout.state.write_text("{garbled")
    assert cli(layout, "hold", "nvidia")[0] == 1
    assert str(layout.state) in capsys.readouterr().err
    assert layout.state.read_text() == "{garbled"
    layout.state.rename(layout.state.with_name("state.json.corrupt-1"))
    assert cli(layout, "generations")[0] == 1
    assert "state.json.corrupt-1" in capsys.readouterr().err


def test_forget_clears_a_rejected_typo_that_kept_the_host_degraded(layout: Layout) -> None:
    """A drop under a name nobody uses was rejected: the host is DEGRADED and retry does not
    know the name (status says to forget it). ``forget`` removes its status file (exit 0,
    saying so) and the host is
    healthy again; a bundle whose generation is active is refused (exit 1), a name with
    neither state nor status file is a usage error (exit 2)."""
    from service.publish.bundle_status import write_status

    save(layout.state, State())
    write_status(layout, "nvidai", BundleState(), phase=Phase.REJECTED, errors=["typo"], drop="x")
    code, out = cli(layout, "status")
    assert code != 0 and "no bundle of that name is known: modstage forget nvidai clears it" in out
    assert cli(layout, "retry", "nvidai")[0] == 2
    code, out = cli(layout, "forget", "nvidai")
    assert code == 0 and "nvidai: forgotten" in out
    assert not (layout.status / "nvidai.json").exists()
    assert cli(layout, "status")[0] == 0
    assert cli(layout, "forget", "nvidai")[0] == 2
    failed_upgrade(layout)
    assert cli(layout, "forget", "nvidia")[0] == 1


def test_a_verb_on_a_name_known_only_from_a_rejected_drop_points_at_forget(
    layout: Layout, capsys: pytest.CaptureFixture[str]
) -> None:
    """retry (or any verb) on a name only a rejected drop's status file knows exits 2 with
    one line naming that file and ``modstage forget NAME``; a name with no trace at all is
    not told to forget anything."""
    from service.publish.bundle_status import write_status

    failed_upgrade(layout)
    write_status(layout, "nvidai", BundleState(), phase=Phase.REJECTED, errors=["typo"], drop="x")
    assert cli(layout, "retry", "nvidai")[0] == 2
    [line] = capsys.readouterr().err.strip().splitlines()
    assert "no bundle named 'nvidai'" in line and "modstage forget nvidai" in line
    assert str(layout.status / "nvidai.json") in line
    assert cli(layout, "rollback", "amd")[0] == 2
    assert "forget" not in capsys.readouterr().err

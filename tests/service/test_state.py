"""The state's named transitions, driven as intake, the daemon and boot drive them, and
the persisted state file (typed records, old files, corrupt files)."""

from __future__ import annotations

import copy
import json
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from service.bundles import verbs
from service.bundles.phase import Phase
from service.bundles.records import HistoryEntry, ModuleLoad, RebootIntent, RefusedDrop
from service.bundles.state import HISTORY_LIMIT, BundleState, Generation, State
from service.bundles.statefile import decode, encode, load, migrated, read, save
from service.errors import IllegalTransition, StateCorrupt, StateError

K = "6.1.0-57-amd64"
A, B, C = "a" * 64, "b" * 64, "c" * 64


def gen(gid: str, added: float = 1.0, kernel: str = K) -> Generation:
    """A fresh generation as intake records it."""
    return Generation(gid, f"v-{gid[0]}", kernel, added=added)


def live(gid: str = A) -> BundleState:
    """A bundle whose generation ``gid`` was staged, booted and came up."""
    b = BundleState().staged(gen(gid), retain=3).booting(gid)
    return b.went_live(gid, (ModuleLoad("nvidia", "S1", 12.5),))


def test_a_generation_goes_from_staged_to_active() -> None:
    """staged -> reboot asked -> booting (one attempt) -> live: active, loads recorded."""
    b = BundleState().staged(gen(A), retain=3)
    assert (b.phase, b.pending, b.active) == (Phase.PENDING, A, None)
    assert b.awaits_reboot(K) and not b.awaits_reboot("other")
    b = b.reboot_asked("asked via kured")
    assert b.phase is Phase.REBOOT_SCHEDULED and b.history[-1].note == "asked via kured"
    b = b.booting(A)
    assert b.phase is Phase.LOADING and b.generations[A].attempts == 1
    b = b.went_live(A, (ModuleLoad("nvidia", "S1", 3.0),))
    assert (b.phase, b.active, b.pending) == (Phase.ACTIVE, A, None)
    assert b.generations[A].attempts == 0 and b.loaded[0].module == "nvidia"
    assert [(h.source, h.target) for h in b.history] == [
        ("none", "pending"),
        ("pending", "reboot_scheduled"),
        ("reboot_scheduled", "loading"),
        ("loading", "active"),
    ]


def test_a_failed_new_generation_falls_back_to_the_last_good() -> None:
    """A pending generation that fails is failed for good; the fallback counts no attempt."""
    b = live(A).staged(gen(B, added=2.0), retain=3).booting(B)
    b = b.failed(B, "ENOKEY: unsigned")
    assert (b.phase, b.pending, b.active) == (Phase.FAILED, None, A)
    assert b.generations[B].failed == "ENOKEY: unsigned"
    b = b.booting(A)
    assert b.generations[A].attempts == 0
    b = b.went_live(A, ())
    assert (b.phase, b.active) == (Phase.ACTIVE, A) and b.generations[B].failed


def test_a_failed_fallback_marks_no_generation_failed() -> None:
    """The last good failing to load leaves it unmarked (the next boot tries it again)."""
    b = live(A).booting(A).failed(A, "EEXIST")
    assert b.phase is Phase.FAILED and b.generations[A].failed is None and b.active == A


def test_attempts_accumulate_until_expired() -> None:
    """Each boot of the pending generation counts; expired fails it and clears pending."""
    b = live(A).staged(gen(B, added=2.0), retain=3)
    b = b.booting(B).booting(B)  # a crash mid-load, then the next boot
    assert b.generations[B].attempts == 2
    b = b.expired("did not complete boot in 2 attempts")
    assert (b.phase, b.pending) == (Phase.FAILED, None)
    assert b.generations[B].failed == "did not complete boot in 2 attempts"


def test_staging_the_same_generation_again_changes_nothing() -> None:
    """A drop of what is already pending or active is a no-op; after a failure it is not."""
    b = BundleState().staged(gen(A), retain=3)
    assert b.staged(gen(A, added=9.0), retain=3) is b
    active = live(A)
    assert active.staged(gen(A, added=9.0), retain=3) is active
    failed_active = live(A).booting(A).failed(A, "x")
    again = failed_active.staged(gen(A, added=9.0), retain=3)
    assert again.phase is Phase.PENDING and again.pending == A


def test_the_active_generation_unloaded_from_outside_is_pending_again() -> None:
    """reloading: the active generation is pending once more (a reboot awaited), the next
    boot brings it up with its attempts reset; refused when it is not the active one, the
    bundle is not active, or an admin holds it."""
    b = live(A).reloading(A)
    assert (b.phase, b.active, b.pending) == (Phase.PENDING, A, A) and b.awaits_reboot(K)
    b = b.reboot_asked("asked").booting(A).went_live(A, (ModuleLoad("nvidia", "S1", 3.0),))
    assert (b.phase, b.active, b.pending) == (Phase.ACTIVE, A, None)
    assert b.generations[A].attempts == 0
    with pytest.raises(IllegalTransition):
        live(A).reloading(B)
    with pytest.raises(IllegalTransition):
        live(A).reloading(A).reloading(A)
    with pytest.raises(IllegalTransition):
        verbs.hold(live(A)).reloading(A)


def test_staged_forgets_past_retain_but_never_active_or_pending() -> None:
    """Beyond ``retain`` the oldest generations go; the active one always stays."""
    b = live(A)
    for i, gid in enumerate((B, C, "d" * 64), start=2):
        b = b.staged(gen(gid, added=float(i)), retain=2)
    assert set(b.generations) == {A, C, "d" * 64}


@pytest.mark.parametrize(
    ("make", "verb"),
    [
        (lambda: live(A).booting(A).staged(gen(B), 3), "staged"),  # while loading
        (lambda: verbs.hold(live(A)).staged(gen(B), 3), "staged"),
        (lambda: live(A).staged(gen(B), 3).booting(B).failed(B, "x").staged(gen(B), 3), "staged"),
        (lambda: live(A).reboot_asked("n"), "reboot_asked"),  # nothing pending
        (lambda: live(A).went_live(A, ()), "went_live"),  # nothing being loaded
        (lambda: live(A).failed(A, "x"), "failed"),
        (lambda: live(A).booting(B), "booting"),  # unknown generation
        (lambda: live(A).expired("x"), "expired"),
        (lambda: BundleState().booting(A), "booting"),
    ],
)
def test_a_transition_refuses_what_may_not_precede_it(make: object, verb: str) -> None:
    """Each transition names itself and the phase it was refused in."""
    with pytest.raises(IllegalTransition, match=f"illegal transition {verb} from ") as info:
        make()  # type: ignore[operator]
    assert info.value.verb == verb


def test_the_daemon_records_its_intent_and_clears_it_after_the_reboot() -> None:
    """reboot_asked schedules the named bundles and keeps the intent; rebooted clears it
    only in a later boot."""
    state = State({"nvidia": BundleState().staged(gen(A), 3)}, boot_id="boot-1")
    assert state.awaiting_reboot(K) == ["nvidia"]
    intent = RebootIntent(5.0, "boot-1", "kured", ("nvidia",), "new generation pending")
    asked = state.reboot_asked(intent, "reboot asked via kured")
    assert asked.bundle("nvidia").phase is Phase.REBOOT_SCHEDULED
    assert asked.intent_in("boot-1") == intent and asked.intent_in("boot-2") is None
    assert asked.reboot_asked(intent, "again").bundle("nvidia") == asked.bundle("nvidia")
    with pytest.raises(IllegalTransition, match="asked in this boot"):
        asked.rebooted("boot-1")
    assert asked.rebooted("boot-2").reboot is None
    with pytest.raises(IllegalTransition, match="no reboot was asked"):
        state.rebooted("boot-2")
    with pytest.raises(IllegalTransition, match="names no bundle"):
        state.reboot_asked(RebootIntent(5.0, "boot-1"), "n")


def test_a_held_bundle_does_not_wait_for_a_reboot() -> None:
    """A hold keeps the pending generation but no reboot is wanted for it."""
    state = State({"nvidia": verbs.hold(BundleState().staged(gen(A), 3))})
    assert state.awaiting_reboot(K) == []


def test_a_failed_generation_that_goes_live_is_failed_no_more() -> None:
    """A failed generation the boot then loads (here: while another is being booted) is
    active and its failure cleared: the kept generations are never failed ones."""
    b = BundleState().staged(gen(A, 1.0), 2).booting(A).failed(A, "why")
    assert b.generations[A].failed == "why"
    b = b.staged(gen(B, 2.0), 2).booting(B).went_live(A, ())
    assert b.active == A and b.generations[A].failed is None
    assert all(not b.generations[g].failed for g in b.keep())


def test_the_published_digest_follows_the_deployed_pod() -> None:
    """``deployed`` names the generation a driver pod last brought: a pending one that went
    live, or one that failed or expired at boot, which stays named while the last known
    good is brought back (fallback, plain reboots) until another pending one goes live."""
    assert live(A).deployed == A
    b = live(A).staged(gen(B, added=2.0), retain=3).booting(B).failed(B, "ENODEV")
    assert b.deployed == B
    b = b.booting(A).went_live(A, ())
    assert (b.active, b.deployed) == (A, B)
    b = b.booting(A).went_live(A, ())  # a plain reboot
    assert b.deployed == B
    b = b.reloading(A).booting(A).went_live(A, ())  # A's pod unloaded A and dropped it again
    assert b.deployed == A
    b = b.staged(gen(C, added=3.0), retain=3).booting(C).booting(C).expired("2 attempts")
    assert b.deployed == C and b.booting(A).went_live(A, ()).deployed == C


REFUSED_B = RefusedDrop(5.0, "modules/nvidia.ko: ENOKEY", "v-b", B, "digest-b")


def test_a_refused_drop_after_an_unload_makes_the_active_generation_pending_again() -> None:
    """after_refusal with the active generation's modules gone: it is pending again (a
    reboot awaited) and the refused drop recorded; the boot brings it up and the refused
    drop's digest is published, as long as no drop is accepted (a new generation staged,
    or the active one dropped again, ends it)."""
    b = live(A).after_refusal(REFUSED_B, unloaded=True)
    assert (b.phase, b.active, b.pending, b.refused) == (Phase.PENDING, A, A, REFUSED_B)
    assert b.awaits_reboot(K) and "refused" in b.history[-1].note
    assert b.published_digest({A: "digest-a"}) == "digest-b"
    b = b.reboot_asked("asked").booting(A).went_live(A, (ModuleLoad("nvidia", "S1", 3.0),))
    assert (b.phase, b.active, b.pending, b.refused) == (Phase.ACTIVE, A, None, REFUSED_B)
    assert b.published_digest({A: "digest-a"}) == "digest-b"
    nameless = replace(REFUSED_B, digest=None)  # a refused pod without a digest: none
    assert live(A).after_refusal(nameless, True).published_digest({A: "digest-a"}) is None
    staged = b.staged(gen(C, added=2.0), retain=3)
    assert staged.refused is None and staged.published_digest({A: "digest-a"}) == "digest-a"
    again = b.staged(gen(A, added=9.0), retain=3)  # the active one dropped, still loaded
    assert again.refused is None and again.phase is Phase.ACTIVE
    assert b.reloading(A).refused is None  # dropped again after an unload


def test_a_refused_drop_while_the_modules_are_loaded_changes_nothing() -> None:
    """Modules still in the kernel, nothing active, or an admin's hold: after_refusal
    returns the bundle itself (state.json is not written, no reboot is awaited). So does
    a new generation waiting for its reboot, loaded or not: the refused drop is recorded
    only while the active generation itself waits to be reloaded."""
    for b in (live(A), BundleState(), BundleState().staged(gen(A), 3)):
        assert b.after_refusal(REFUSED_B, unloaded=False) is b
    newer = live(A).staged(gen(C, added=2.0), retain=3)
    for waiting in (newer, newer.reboot_asked("asked")):
        assert waiting.pending == C and waiting.active == A
        for unloaded in (False, True):
            assert waiting.after_refusal(REFUSED_B, unloaded) is waiting
    held = verbs.hold(live(A))
    assert held.after_refusal(REFUSED_B, unloaded=True) is held
    assert held.after_refusal(REFUSED_B, unloaded=True).awaits_reboot(K) is False


def test_the_same_refused_drop_never_asks_a_second_reboot() -> None:
    """The pod restarting and dropping the refused bundle again: while the reload waits
    (pending, reboot scheduled) nothing changes; once it went live nothing changes either,
    even if its modules left the kernel again (one reboot per refused drop, never a loop).
    Another refused drop while the reload waits is recorded in its place, with no other
    reboot awaited; after the reload went live, another refused drop reloads once."""
    b = live(A).after_refusal(REFUSED_B, True)
    assert b.after_refusal(replace(REFUSED_B, at=9.0), True) is b
    scheduled = b.reboot_asked("asked")
    assert scheduled.after_refusal(REFUSED_B, True) is scheduled
    c = RefusedDrop(6.0, "ENOKEY", "v-c", C, "digest-c")
    replaced = scheduled.after_refusal(c, True)
    assert (replaced.phase, replaced.pending, replaced.refused) == (Phase.REBOOT_SCHEDULED, A, c)
    up = b.booting(A).went_live(A, ())
    assert up.after_refusal(REFUSED_B, unloaded=False) is up
    assert up.after_refusal(REFUSED_B, unloaded=True) is up  # unloaded once more: no loop
    other = up.after_refusal(c, unloaded=True)
    assert (other.phase, other.pending, other.refused) == (Phase.PENDING, A, c)


def test_a_refused_drop_is_saved_and_read_back(tmp_path: Path) -> None:
    """The refused drop is a typed record of state.json, absent while there is none."""
    state = State({"nvidia": live(A).after_refusal(REFUSED_B, True)}, "boot")
    save(tmp_path / "state.json", state)
    assert load(tmp_path / "state.json") == state
    assert "refused" not in json.loads(encode(State({"nvidia": live(A)})))["bundles"]["nvidia"]


_VERBS = st.sampled_from(["staged", "reboot_asked", "booting", "went_live", "failed", "expired"])


@settings(max_examples=200)
@given(st.lists(st.tuples(_VERBS, st.sampled_from([A, B, C])), max_size=25))
def test_any_sequence_of_transitions_keeps_the_state_sound(steps: list[tuple[str, str]]) -> None:
    """Whatever is asked in whatever order: a transition either applies or raises
    IllegalTransition, and the state stays sound (active and pending known and not
    failed, attempts counted, history bounded, active only after went_live)."""
    b, added = BundleState(), 0.0
    for verb, gid in steps:
        added += 1.0
        args: dict[str, tuple[object, ...]] = {
            "staged": (gen(gid, added), 2),
            "reboot_asked": ("n",),
            "booting": (gid,),
            "went_live": (gid, ()),
            "failed": (gid, "why"),
            "expired": ("why",),
        }
        before = b
        try:
            b = getattr(b, verb)(*args[verb])
        except IllegalTransition:
            continue
        assert b.keep() <= set(b.generations)
        assert all(not b.generations[g].failed for g in b.keep())
        assert all(g.attempts >= 0 for g in b.generations.values())
        assert len(b.history) <= HISTORY_LIMIT
        if b.phase is Phase.ACTIVE and before.phase is not Phase.ACTIVE:
            assert verb == "went_live" and b.active == gid
        assert migrated(b) == b  # reading a file the transitions wrote changes nothing
        if verb == "went_live":  # the digest published: the live one's, or a failed one's
            named = b.generations.get(b.deployed or "")
            assert b.deployed == gid or (named is not None and named.failed)
            if gid == before.pending:
                assert b.deployed == gid


def test_round_trip_through_the_file(tmp_path: Path) -> None:
    """What is saved is what is loaded, records included."""
    b = live(A).staged(gen(B, added=2.0), retain=3)
    intent = RebootIntent(7.5, "boot", "none", ("nvidia",), "new generation pending")
    state = State({"nvidia": b}, "boot").reboot_asked(intent, "waiting")
    save(tmp_path / "state.json", state)
    assert load(tmp_path / "state.json") == state


OLD_FORMAT = {
    "format": 1,
    "boot_id": "boot-2",
    "reboot": {
        "at": 1700000000.5,
        "boot_id": "boot-1",
        "backend": "kured",
        "bundles": ["nvidia"],
        "reason": "new generation pending for nvidia",
    },
    "bundles": {
        "nvidia": {
            "phase": "reboot_scheduled",
            "active": A,
            "pending": B,
            "held": False,
            "generations": {
                A: {
                    "id": A,
                    "version": "1",
                    "kernel": K,
                    "added": 1.0,
                    "attempts": 0,
                    "failed": None,
                },
                B: {
                    "id": B,
                    "version": "2",
                    "kernel": K,
                    "added": 2.0,
                    "attempts": 0,
                    "failed": None,
                },
            },
            "loaded": [
                {"module": "i2c_core", "srcversion": "S0", "already_loaded": True},
                {"module": "nvidia", "srcversion": "S1", "ms": 412.5},
            ],
            "history": [
                {"at": 1.0, "from": "none", "to": "pending", "note": "generation aaaa pending"},
                {"at": 2.0, "from": "pending", "to": "reboot_scheduled"},
            ],
        }
    },
}


def test_a_state_file_written_before_the_records_reads_and_is_rewritten_identically(
    tmp_path: Path,
) -> None:
    """An existing state.json (untyped dicts on disk) reads into the typed records and
    is written back byte for byte: the on-disk format did not change."""
    raw = json.dumps(OLD_FORMAT, indent=1, sort_keys=True).encode() + b"\n"
    (tmp_path / "state.json").write_bytes(raw)
    state = read(tmp_path / "state.json")
    b = state.bundle("nvidia")
    assert b.loaded == (
        ModuleLoad("i2c_core", "S0", already_loaded=True),
        ModuleLoad("nvidia", "S1", 412.5),
    )
    assert b.history[1] == HistoryEntry(2.0, "pending", "reboot_scheduled")
    assert state.reboot == RebootIntent(
        1700000000.5, "boot-1", "kured", ("nvidia",), "new generation pending for nvidia"
    )
    assert encode(state) == raw


def _saved_before_deployed(failed_added: float | None) -> dict[str, Any]:
    """:data:`OLD_FORMAT` with A active and B, added at ``failed_added``, failed at boot
    (None: B never failed), as a version without ``deployed`` saved it."""
    doc = copy.deepcopy(OLD_FORMAT)
    nvidia = doc["bundles"]["nvidia"]
    nvidia.update(phase="active", pending=None)
    if failed_added is not None:
        nvidia["generations"][B].update(added=failed_added, attempts=1, failed="ENODEV")
    assert "deployed" not in nvidia
    return doc


def test_a_state_saved_before_deployed_existed_is_migrated_once_when_read(
    tmp_path: Path,
) -> None:
    """B failed at boot after A, the active one, was added, in a file saved before
    ``deployed`` was recorded: read, B is the generation deployed (its driver pod is the one
    still deployed), so B's digest is the one published and B's failure the one shown;
    saved, the key is written, and reading that file again changes nothing."""
    path = tmp_path / "state.json"
    path.write_bytes(json.dumps(_saved_before_deployed(failed_added=2.0)).encode())
    state = read(path)
    b = state.bundle("nvidia")
    assert (b.active, b.pending, b.deployed) == (A, None, B)
    assert b.digest_generation({A, B}) == B
    assert b.deployed_failure() == b.generations[B]
    save(path, state)
    assert json.loads(path.read_bytes())["bundles"]["nvidia"]["deployed"] == B
    assert read(path) == state


@pytest.mark.parametrize(
    "failed_added",
    [pytest.param(None, id="nothing-failed"), pytest.param(0.5, id="failed-before-active")],
)
def test_an_old_state_without_a_failure_since_the_active_one_publishes_the_active(
    failed_added: float | None,
) -> None:
    """Saved before ``deployed`` existed, with no generation failed since the active one was
    added (none failed, or B failed before A was added and A came up since): nothing is
    deployed but the active one, whose digest is published, and no failure stands."""
    b = decode(json.dumps(_saved_before_deployed(failed_added)).encode()).bundle("nvidia")
    assert b.deployed is None
    assert b.digest_generation({A, B}) == A
    assert b.deployed_failure() is None


def test_the_digest_published_is_the_deployed_generations_when_one_was_recorded() -> None:
    """A active, C pending and B deployed (B failed at boot, A came back, C was staged
    since): B's digest is published when one was recorded for it, else the active A's; the
    pending C's never is, and B's failure stands."""
    b = live(A).staged(gen(B, added=2.0), retain=3).booting(B).failed(B, "ENODEV")
    b = b.booting(A).went_live(A, ()).staged(gen(C, added=3.0), retain=3)
    assert (b.active, b.pending, b.deployed) == (A, C, B)
    assert b.digest_generation({A, B, C}) == B
    assert b.digest_generation({A, C}) == A
    assert b.deployed_failure() == b.generations[B]
    assert BundleState().digest_generation({A}) is None


def test_an_old_reboot_intent_with_only_time_and_boot_reads() -> None:
    """An intent recorded with just ``at`` and ``boot_id`` is still a valid intent."""
    doc = {**OLD_FORMAT, "reboot": {"at": 3, "boot_id": None}}
    state = decode(json.dumps(doc).encode())
    assert state.reboot == RebootIntent(3.0, None)


@pytest.mark.parametrize(
    ("damage", "field"),
    [
        (lambda d: d["reboot"].pop("at"), "reboot.at"),
        (lambda d: d["reboot"].update(at="noon"), "reboot.at"),
        (lambda d: d["reboot"].update(boot_id=7), "reboot.boot_id"),
        (lambda d: d["reboot"].update(bundles="nvidia"), "reboot.bundles"),
        (lambda d: d["reboot"].update(when=1), "reboot.when: unknown key"),
        (lambda d: d.update(reboot=[1]), "reboot: must be a table or null, not an array"),
        (lambda d: d["bundles"]["nvidia"]["loaded"][1].pop("module"), "nvidia.loaded[1].module"),
        (lambda d: d["bundles"]["nvidia"]["loaded"][1].update(ms="x"), "nvidia.loaded[1].ms"),
        (lambda d: d["bundles"]["nvidia"]["history"][0].update(at=None), "history[0].at"),
        (lambda d: d["bundles"]["nvidia"]["history"][1].update(note=5), "history[1].note"),
    ],
)
def test_a_damaged_record_is_a_state_error_naming_file_and_field(
    tmp_path: Path, damage: object, field: str
) -> None:
    """A hand-edited record (a reboot intent without ``at``, a wrong type) is refused where
    state.json is read, naming the file and the field, never a KeyError later."""
    doc = json.loads(json.dumps(OLD_FORMAT))
    damage(doc)  # type: ignore[operator]
    path = tmp_path / "state.json"
    path.write_text(json.dumps(doc))
    with pytest.raises(StateError) as info:
        read(path)
    assert str(info.value).startswith(f"{path}: state file is corrupt")
    assert field in str(info.value)


@pytest.mark.parametrize("content", [b"{", b"[]", b'{"format": 9}', b'{"format": 1}', b"\xff"])
def test_corrupt_state_is_moved_aside_not_reset(tmp_path: Path, content: bytes) -> None:
    """An unreadable state file is renamed aside and reported; nothing is silently reset."""
    path = tmp_path / "state.json"
    path.write_bytes(content)
    with pytest.raises(StateCorrupt) as info:
        load(path)
    assert not path.exists()
    assert Path(info.value.aside).read_bytes() == content
    assert info.value.aside.startswith(str(path) + ".corrupt-")
    with pytest.raises(StateCorrupt, match="an earlier state file was corrupt"):
        load(path)  # and on every later run, until an admin decides


def test_a_generation_forgotten_by_retain_is_named_in_history() -> None:
    """Intake's retain forgets the oldest generations: the pending move's history note names
    each one forgotten, so a pruned generation never disappears without a trace."""
    b = BundleState()
    ids = [c * 64 for c in "abcd"]
    for i, gid in enumerate(ids):
        b = b.staged(Generation(gid, str(i), K, added=float(i + 1)), 2)
    assert set(b.generations) == set(ids[2:])
    notes = [h.note for h in b.history]
    assert notes[2] == f"generation {ids[2][:12]} pending; retain 2 forgot {ids[0][:12]}"
    assert notes[3] == f"generation {ids[3][:12]} pending; retain 2 forgot {ids[1][:12]}"


def test_an_admins_rollback_is_kept_from_drops_until_it_lapses(tmp_path: Path) -> None:
    """While an admin's rollback is pending, staging another generation is refused (the drop
    waits); the choice is saved and read back, and lapses once its generation is live (a
    drop is staged again after that) or the admin cancels it (then absent from the file)."""
    two = live(A).staged(gen(B, added=2.0), retain=3).booting(B)
    two = two.went_live(B, (ModuleLoad("nvidia", "S2", 1.0),))
    rolled = verbs.rollback(two, A)
    assert rolled.admin_choice is not None and rolled.admin_choice.verb == "rollback"
    with pytest.raises(IllegalTransition, match="rollback to aaaaaaaaaaaa"):
        rolled.staged(gen(C, added=3.0), retain=3)
    assert rolled.staged(gen(A), retain=3) == rolled  # the rollback's own generation again
    save(tmp_path / "state.json", State({"nvidia": rolled}))
    assert load(tmp_path / "state.json").bundle("nvidia") == rolled
    back = rolled.reboot_asked("asked").booting(A).went_live(A, ())
    assert back.admin_choice is None and back.chosen is None
    assert back.staged(gen(C, added=3.0), retain=3).pending == C
    cancelled = verbs.rollback(rolled, B)
    assert cancelled.chosen is None and cancelled.active == B
    assert "chosen" not in json.loads(encode(State({"nvidia": cancelled})))["bundles"]["nvidia"]


def test_a_drop_replacing_an_admins_retry_names_it() -> None:
    """A drop staged over an admin's pending retry replaces it, and its history note says
    which; a drop over a drop's pending generation says nothing of the kind."""
    failed = live(A).staged(gen(B, added=2.0), retain=3).booting(B).failed(B, "ENOKEY")
    retried = verbs.retry(failed.booting(A).went_live(A, ()))
    replaced = retried.staged(gen(C, added=3.0), retain=3)
    assert replaced.pending == C and replaced.chosen is None
    assert (
        replaced.history[-1].note == f"generation {C[:12]} pending; replaces the admin's "
        f"pending retry of {B[:12]} (v-b)"
    )
    plain = live(A).staged(gen(B, added=2.0), retain=3).staged(gen(C, added=3.0), retain=3)
    assert plain.history[-1].note == f"generation {C[:12]} pending"


def test_the_second_guards_of_the_transitions_refuse_on_their_own() -> None:
    """Each transition refuses what its callers also check first (intake's preflight, boot's
    plan), so a race or a caller's slip cannot move a bundle wrongly: a drop of a generation
    an admin rolled back is refused (naming its 12-character id); booting a generation that
    is neither pending nor active, no device outside a load, and expiry with nothing pending
    are refused."""
    two = live(A).staged(gen(B, added=2.0), retain=3).booting(B)
    two = two.went_live(B, (ModuleLoad("nvidia", "S2", 1.0),))
    rolled = verbs.rollback(two, A).reboot_asked("asked").booting(A).went_live(A, ())
    assert rolled.generations[B].rolled_back
    with pytest.raises(IllegalTransition, match=f"rolled generation {B[:12]} back"):
        rolled.staged(gen(B, added=2.0), retain=3)
    stale = live(A).with_generation(gen(C, added=3.0))
    with pytest.raises(IllegalTransition, match=f"{C[:12]} is neither pending nor active"):
        stale.booting(C)
    with pytest.raises(IllegalTransition, match="nothing is being loaded"):
        live(A).no_device(A, "no device")
    with pytest.raises(IllegalTransition, match="no generation is pending"):
        live(A).expired("attempts spent")


def test_no_device_gives_the_pending_generations_attempt_back() -> None:
    """A boot that found no device for the pending generation gives back the attempt
    `booting` counted (and never goes below zero); the active generation's count is not
    touched."""
    pending = live(A).staged(gen(B, added=2.0), retain=3)
    booted = pending.booting(B)
    assert booted.generations[B].attempts == 1
    back = booted.no_device(B, "no device")
    assert back.generations[B].attempts == 0 and back.pending == B
    again = back.booting(B).no_device(B, "no device").booting(B)
    assert again.generations[B].attempts == 1
    zero = replace(
        booted, generations={**booted.generations, B: replace(booted.generations[B], attempts=0)}
    )
    assert zero.no_device(B, "no device").generations[B].attempts == 0
    twice = replace(
        pending, generations={**pending.generations, B: replace(gen(B, 2.0), attempts=1)}
    )
    assert twice.booting(B).no_device(B, "no device").generations[B].attempts == 1
    active = live(A).booting(A).no_device(A, "no device")
    assert active.generations[A].attempts == live(A).generations[A].attempts

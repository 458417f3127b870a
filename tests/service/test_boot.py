"""The boot loader on a temporary root with a recording kernel and real signed modules."""

from __future__ import annotations

import errno
from dataclasses import replace
from pathlib import Path

import pytest
from structlog.testing import capture_logs

from service.boot.loader import summary
from service.bundles.phase import Phase
from service.bundles.statefile import load, save
from service.layout import Layout
from service.verify.signature.trust import TrustStore
from tests.service.fakes import FakeKernel
from tests.service.fakes import boot_with as _boot
from tests.service.fakes import pending as _pending


def test_pending_generation_loads_in_order_with_params(
    host: Layout, signed: dict[str, Path], kernel: str
) -> None:
    """Modules load in manifest order with their params; the generation becomes active.
    Each module's load time, recorded and logged (``module.loaded``, milliseconds), lies
    within the boot's own time."""
    import time

    gen = _pending(
        host,
        kernel,
        [(signed["ms_exporter"], ""), (signed["ms_params"], "count=7 label=hi")],
        memory="online_movable",
    )
    fake = FakeKernel()
    started = time.monotonic()
    with capture_logs() as logs:
        state = _boot(host, fake).run()
    took = (time.monotonic() - started) * 1000
    assert fake.calls == [("load", "ms_exporter", ""), ("load", "ms_params", "count=7 label=hi")]
    b = state.bundle("test")
    assert (b.phase, b.active, b.pending) == (Phase.ACTIVE, gen, None)
    assert [m.module for m in b.loaded] == ["ms_exporter", "ms_params"]
    assert all(m.ms is not None and 0 <= m.ms <= took for m in b.loaded), b.loaded
    loaded = [(e["module"], e["ms"]) for e in logs if e["event"] == "module.loaded"]
    assert loaded == [(m.module, m.ms) for m in b.loaded]
    assert state.boot_id == "11111111-2222-3333-4444-555555555555"
    memory = host.sys / "devices/system/memory"
    assert (memory / "auto_online_blocks").read_text() == "online_movable"
    # the kernel reads an onlined block back as "online"; the zone tells movable from not
    assert [(memory / f"memory{n}/state").read_text().strip() for n in range(5)] == ["online"] * 5
    assert [(memory / f"memory{n}/valid_zones").read_text().strip() for n in (2, 3, 4)] == [
        "Movable"
    ] * 3


def test_failed_second_module_unloads_first_and_restores_last_good(
    host: Layout, signed: dict[str, Path], kernel: str
) -> None:
    """A failing module: this attempt's loads are undone (each unload logged), the
    generation is failed (and logged so), LKG reloads; the boot's last lines say where each
    bundle ended, ``-`` for a generation it has none of."""
    good = _pending(host, kernel, [(signed["ms_exporter"], "")])
    _boot(host, FakeKernel()).run()
    bad = _pending(host, kernel, [(signed["ms_params"], ""), (signed["ms_enodev"], "")], "2")
    fake = FakeKernel(fail={"ms_enodev": errno.ENODEV})
    with capture_logs() as logs:
        state = _boot(host, fake).run()
    assert fake.calls == [
        ("load", "ms_params", ""),
        ("load", "ms_enodev", ""),
        ("unload", "ms_params"),
        ("load", "ms_exporter", ""),
    ]
    [failed] = [e for e in logs if e["event"] == "generation.failed"]
    assert (failed["bundle"], failed["generation"], failed["log_level"]) == ("test", bad, "error")
    [active] = [e for e in logs if e["event"] == "generation.active"]
    assert (active["generation"], active["modules"]) == (good, 1)
    b = state.bundle("test")
    assert (b.phase, b.active, b.pending) == (Phase.ACTIVE, good, None)
    assert b.generations[bad].failed == (
        "modules/ms_enodev.ko: ENODEV: the module's init found no device (init returned -ENODEV)"
    )
    assert [h.target for h in b.history[-4:]] == ["loading", "failed", "loading", "active"]
    [unloaded] = [e for e in logs if e["event"] == "module.unloaded"]
    assert (unloaded["module"], unloaded["log_level"]) == ("ms_params", "info")
    why = b.generations[bad].failed
    assert summary(state) == [
        f"test: active (active {good}, pending -); fell back from {bad[:12]} (2): {why}"
    ]
    failed_alone = replace(state, bundles={"test": replace(b, active=None)})
    assert summary(failed_alone) == [
        f"test: active (active -, pending -); fell back from {bad[:12]} (2): {why}"
    ]


def test_a_module_that_cannot_be_unloaded_after_a_failure_is_logged(
    host: Layout, signed: dict[str, Path], kernel: str
) -> None:
    """When undoing a failed attempt cannot unload a module (something holds a reference to
    it), the boot goes on to the fallback and logs the module and the kernel's reason as an
    error: the admin learns what is left loaded."""
    _pending(host, kernel, [(signed["ms_params"], ""), (signed["ms_enodev"], "")])
    fake = FakeKernel(fail={"ms_enodev": errno.ENODEV}, refcnt={"ms_params": 1})
    with capture_logs() as logs:
        _boot(host, fake).run()
    assert ("unload", "ms_params") in fake.calls
    [stuck] = [e for e in logs if e["event"] == "module.unload_failed"]
    assert (stuck["module"], stuck["log_level"]) == ("ms_params", "error")
    assert "Resource temporarily unavailable" in stuck["reason"]


def test_attempts_are_persisted_before_loading_and_expire(
    host: Layout, signed: dict[str, Path], kernel: str
) -> None:
    """A boot that never finishes counts; past max_boot_attempts the LKG is loaded instead."""
    good = _pending(host, kernel, [(signed["ms_exporter"], "")])
    _boot(host, FakeKernel()).run()
    bad = _pending(host, kernel, [(signed["ms_panic"], "")], "2")

    class Crash(FakeKernel):
        def load(self, fd: int, params: str, *, compressed: bool = False) -> None:
            raise SystemExit("power cut")  # the node dies inside finit_module

    for attempt in (1, 2):
        with pytest.raises(SystemExit):
            _boot(host, Crash(), max_boot_attempts=2).run()
        b = load(host.state).bundle("test")
        assert (b.phase, b.generations[bad].attempts) == (Phase.LOADING, attempt)
    fake = FakeKernel()
    state = _boot(host, fake, max_boot_attempts=2).run()
    b = state.bundle("test")
    assert fake.calls == [("load", "ms_exporter", "")]
    assert (b.phase, b.active, b.pending) == (Phase.ACTIVE, good, None)
    assert b.generations[bad].failed == "did not complete boot in 2 attempts (max_boot_attempts)"


def test_pending_for_another_kernel_stays_pending(
    host: Layout, signed: dict[str, Path], kernel: str
) -> None:
    """A pending generation built for another release is not loaded and stays pending."""
    gen = _pending(host, kernel, [(signed["ms_exporter"], "")])
    state = load(host.state)
    b = state.bundle("test")
    b = b.with_generation(replace(b.generations[gen], kernel="6.12.0-9-amd64"))
    save(host.state, state.with_bundle("test", b))
    fake = FakeKernel()
    after = _boot(host, fake).run().bundle("test")
    assert fake.calls == []
    assert (after.phase, after.pending) == (Phase.PENDING, gen)


def test_bundles_load_after_the_bundles_they_name(
    host: Layout, signed: dict[str, Path], kernel: str
) -> None:
    """A bundle with after=[x] loads once x is loaded, whatever the names' order."""
    _pending(
        host, kernel, [(signed["ms_consumer"], "")], bundle="a-consumer", after=("z-exporter",)
    )
    _pending(host, kernel, [(signed["ms_exporter"], "")], bundle="z-exporter")
    fake = FakeKernel()
    _boot(host, fake).run()
    assert [c[1] for c in fake.calls] == ["ms_exporter", "ms_consumer"]


def test_bundles_after_each_other_load_in_name_order_and_the_cycle_is_logged(
    host: Layout, signed: dict[str, Path], kernel: str
) -> None:
    """Two bundles each loading after the other: both still load (in name order), and the
    boot logs the cycle naming both, as ``plan.order`` promises."""
    _pending(host, kernel, [(signed["ms_params"], "")], bundle="b-one", after=("a-two",))
    _pending(host, kernel, [(signed["ms_firmware"], "")], bundle="a-two", after=("b-one",))
    fake = FakeKernel()
    with capture_logs() as logs:
        _boot(host, fake).run()
    assert [c[1] for c in fake.calls] == ["ms_firmware", "ms_params"]
    cycles = [e for e in logs if e["event"] == "bundles.after_cycle"]
    assert cycles == [{"event": "bundles.after_cycle", "bundles": ["a-two", "b-one"],
                       "log_level": "error"}]  # fmt: skip


def test_order_reports_only_the_bundles_a_cycle_holds() -> None:
    """plan.order: a chain named against the alphabet (c after b after a, given in reverse)
    is ordered with no cycle; a cycle (x and y after each other) and a bundle after one of
    them come last in name order and are what is reported; a bundle after an absent one
    is free."""
    from service.boot.plan import Choice, order

    names = ["z-free", "y", "x-after-y", "after-x", "c", "b", "a"]
    choices = [Choice(n, f"gen-{n}") for n in names]
    chain = {"a": ("b",), "b": ("c",), "z-free": ("gone",)}
    done, cycle = order(choices, chain)
    assert ([c.bundle for c in done], cycle) == (
        ["after-x", "c", "x-after-y", "y", "z-free", "b", "a"],
        (),
    )
    tangled = {**chain, "x-after-y": ("y",), "y": ("x-after-y",), "after-x": ("x-after-y",)}
    done, cycle = order(choices, tangled)
    assert [c.bundle for c in done] == ["c", "z-free", "b", "a", "after-x", "x-after-y", "y"]
    assert cycle == ("after-x", "x-after-y", "y")


def test_choose_takes_the_pending_generation_only_when_it_may_run() -> None:
    """plan.choose: a pending generation for the running kernel with attempts left is loaded
    as pending (an attempt is counted), with the active one as its fallback (none when it is
    the active one dropped again); without one, or when it failed, targets another kernel or
    is out of attempts, the active generation loads and nothing is pending (out of attempts:
    it is expired, with the reason)."""
    from service.boot.plan import Choice, choose
    from service.bundles.state import BundleState, Generation

    def bundle(*, pending: Generation | None, active: str | None = "old") -> BundleState:
        gens = {"old": Generation("old", "1", "k"), **({pending.id: pending} if pending else {})}
        return BundleState(active=active, pending=pending.id if pending else None, generations=gens)

    new = Generation("new", "2", "k", attempts=1)
    assert choose("b", bundle(pending=new), "k", 3) == Choice("b", "new", "old", pending=True)
    again = Generation("old", "1", "k", attempts=1)
    assert choose("b", bundle(pending=again), "k", 3) == Choice("b", "old", None, pending=True)
    assert choose("b", bundle(pending=None), "k", 3) == Choice("b", "old")
    failed = replace(new, failed="modprobe: ENOEXEC")
    assert choose("b", bundle(pending=failed), "k", 3) == Choice("b", "old")
    other = choose("b", bundle(pending=replace(new, kernel="k2")), "k", 3)
    assert (other.generation, other.pending) == ("old", False) and "k2" in other.note
    spent = choose("b", bundle(pending=replace(new, attempts=3)), "k", 3)
    assert (spent.generation, spent.pending) == ("old", False)
    assert spent.expired == "did not complete boot in 3 attempts (max_boot_attempts)"


def test_a_pending_generation_out_of_attempts_is_expired_and_logged(
    host: Layout, signed: dict[str, Path], kernel: str
) -> None:
    """A pending generation that used up ``max_boot_attempts`` without completing a boot
    (each boot died while loading it: the state says loading, three attempts) is not loaded
    again: boot expires it with the reason, nothing is left pending, and the expiry is
    logged as an error naming the bundle, the generation and the reason (then that the
    bundle has nothing to load)."""
    gen = _pending(host, kernel, [(signed["ms_params"], "")])
    state = load(host.state)
    b = state.bundle("test")
    spent = replace(b.generations[gen], attempts=3)
    died = replace(b, phase=Phase.LOADING, generations={**b.generations, gen: spent})
    bundles = {**state.bundles, "test": died}
    save(host.state, replace(state, bundles=bundles))
    fake = FakeKernel()
    with capture_logs() as logs:
        after = _boot(host, fake).run().bundle("test")
    assert after.pending is None and after.active is None and fake.calls == []
    why = "did not complete boot in 3 attempts (max_boot_attempts)"
    [expired] = [e for e in logs if e["event"] == "generation.expired"]
    assert (expired["bundle"], expired["generation"], expired["reason"]) == ("test", gen, why)
    assert expired["log_level"] == "error"
    [nothing] = [e for e in logs if e["event"] == "bundle.nothing_to_load"]
    assert nothing["bundle"] == "test" and nothing["log_level"] == "info"


def test_same_module_already_loaded(host: Layout, signed: dict[str, Path], kernel: str) -> None:
    """A live module with the same srcversion counts as loaded; another version is an error."""
    _pending(host, kernel, [(signed["ms_params"], "")])
    from service.verify.verdict import verify_path

    src = verify_path(
        signed["ms_params"], trust=TrustStore.from_directory(host.trusted), kernel=kernel
    ).srcversion
    assert src
    same = FakeKernel(live={"ms_params": src})
    assert _boot(host, same).run().bundle("test").phase is Phase.ACTIVE
    assert same.calls == []
    _pending(host, kernel, [(signed["ms_params"], "count=1")], "2")
    other = FakeKernel(live={"ms_params": "0123456789ABCDEF"})
    b = _boot(host, other).run().bundle("test")
    # the last known good carries the same module, so it cannot come back either
    assert b.phase is Phase.FAILED and b.active is not None and other.calls == []
    failed = [g.failed for g in b.generations.values() if g.failed]
    assert failed == [
        f"ms_params: another version is already loaded (srcversion "
        f"0123456789ABCDEF, this generation has {src})"
    ]


def test_a_failed_generation_never_unloads_a_module_it_found_loaded(
    host: Layout, signed: dict[str, Path], kernel: str
) -> None:
    """Undoing a failed attempt unloads only what that attempt loaded: a module of the
    generation already live (same srcversion) before boot stays loaded when a later module
    of the generation fails."""
    from service.verify.verdict import verify_path

    _pending(host, kernel, [(signed["ms_params"], ""), (signed["ms_enodev"], "")])
    src = verify_path(
        signed["ms_params"], trust=TrustStore.from_directory(host.trusted), kernel=kernel
    ).srcversion
    fake = FakeKernel(live={"ms_params": src}, fail={"ms_enodev": errno.ENODEV})
    b = _boot(host, fake).run().bundle("test")
    assert b.phase is Phase.FAILED
    assert fake.calls == [("load", "ms_enodev", "")]
    assert "ms_params" in fake.loaded()


def test_firmware_view_and_path(
    host: Layout, signed: dict[str, Path], kernel: str, tmp_path: Path
) -> None:
    """firmware_class.path points at a view linking the generation's firmware; foreign kept."""
    fw = tmp_path / "fw" / "modstage"
    fw.mkdir(parents=True)
    (fw / "test.bin").write_bytes(b"x" * 1234)
    gen = _pending(host, kernel, [(signed["ms_firmware"], "")], firmware_dirs=(tmp_path / "fw",))
    param = host.sys / "module/firmware_class/parameters/path"
    param.write_text("/opt/other\n")
    b = _boot(host, FakeKernel()).run().bundle("test")
    assert b.phase is Phase.FAILED and param.read_text() == "/opt/other\n"
    assert "already set to '/opt/other'" in str(b.generations[gen].failed)
    param.write_text("\n")
    gen2 = _pending(
        host,
        kernel,
        [(signed["ms_firmware"], "fw_name=modstage/test.bin")],
        "2",
        firmware_dirs=(tmp_path / "fw",),
    )
    b = _boot(host, FakeKernel()).run().bundle("test")
    assert (b.phase, b.active) == (Phase.ACTIVE, gen2)
    view = host.run / "firmware"
    assert param.read_text() == f"{view}\n"  # the kernel reads a string parameter back so
    assert (view / "modstage/test.bin").read_bytes() == b"x" * 1234


def test_a_boot_linking_no_firmware_clears_the_path_left_by_an_earlier_one(
    host: Layout, signed: dict[str, Path], kernel: str
) -> None:
    """When nothing brought up links firmware, boot clears ``firmware_class.path`` if it
    still names modstage's view (left by an earlier boot): the kernel must not look for
    firmware in a view that no longer holds any."""
    param = host.sys / "module/firmware_class/parameters/path"
    param.write_text(f"{host.run / 'firmware'}\n")
    _pending(host, kernel, [(signed["ms_params"], "")])
    b = _boot(host, FakeKernel()).run().bundle("test")
    assert b.phase is Phase.ACTIVE
    assert param.read_text().strip("\n\0") == ""


def test_boot_hands_hot_added_memory_to_the_hosts_policy_and_moves_misplaced_blocks(
    host: Layout, signed: dict[str, Path], kernel: str
) -> None:
    """A kernel that onlines by itself (``auto_online_blocks`` boots as ``online``): with the
    host's ``hotplug_policy`` set, boot sets it to ``offline`` before any bundle (so later
    blocks reach the daemon offline); a bundle's own policy then overrides it, and a
    hot-pluggable block the kernel onlined into ZONE_NORMAL is moved to ZONE_MOVABLE."""
    memory = host.sys / "devices/system/memory"
    (memory / "auto_online_blocks").write_text("online\n")
    with capture_logs() as logs:
        _boot(host, FakeKernel(), hotplug_policy="online_movable").run()
    assert (memory / "auto_online_blocks").read_text() == "offline"
    assert [e["event"] for e in logs if e["event"].startswith("memory.")] == ["memory.handed_over"]

    (memory / "auto_online_blocks").write_text("online\n")
    (memory / "memory9").mkdir()
    (memory / "memory9/state").write_text("online\n")
    (memory / "memory9/valid_zones").write_text("Normal\n")
    (memory / "memory9/firmware_node").symlink_to(host.sys)
    _pending(host, kernel, [(signed["ms_params"], "")], memory="online_movable")
    with capture_logs() as logs:
        _boot(host, FakeKernel(), hotplug_policy="online_movable").run()
    assert (memory / "auto_online_blocks").read_text() == "online_movable"
    assert (memory / "memory9/valid_zones").read_text().strip() == "Movable"
    moved = [e for e in logs if e["event"] == "memory.onlined" and e.get("block") == 9]
    assert moved and moved[0]["moved_from"] == "Normal"

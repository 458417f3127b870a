"""A driver unloaded while a generation for another kernel is pending is brought back.

The bundle sits in phase ``pending`` for a generation built for another kernel (the next
kernel's drop, or one for an installed fallback kernel) while the running kernel's driver is
the active generation. A new driver pod's init container unloads it, then drops the same
build again, or a drop that is refused: the active generation is pending again for its
reboot, and the displaced generation stays retained and carried, so a boot into its kernel
still loads it.
"""

from __future__ import annotations

import shutil
from dataclasses import replace
from pathlib import Path

import pytest

from service.bundles.cover import carried, next_kernel_cover
from service.bundles.phase import Phase
from service.bundles.records import ModuleLoad, RefusedDrop
from service.bundles.state import BundleState, Generation, State
from service.bundles.statefile import load, save
from service.errors import IllegalTransition
from service.layout import Layout
from stager.drop import ModuleSpec, stage
from tests.kmod import SigningKey, sign
from tests.service.fakes import FakeKernel, boot_with, make_intake, pending
from tests.service.test_carried import OTHER, other_kernel_generation
from tests.service.test_sequences import reboot

K, NEXT = "6.1.0-57-amd64", "6.12.0-next"
A, W, C = "a" * 64, "w" * 64, "c" * 64
REFUSED = RefusedDrop(5.0, "ENOKEY", "v-b", "b" * 64, "digest-b")


def waiting_for_next() -> BundleState:
    """A live on kernel K (its loads recorded), W for kernel NEXT pending after it."""
    b = BundleState().staged(Generation(A, "1", K, added=1.0), retain=3).booting(A)
    b = b.went_live(A, (ModuleLoad("nvidia", "S1", 12.5),))
    return b.staged(Generation(W, "1", NEXT, added=2.0), retain=3, installed={K, NEXT})


@pytest.mark.parametrize("scheduled", [False, True])
def test_reloading_displaces_a_pending_generation_for_another_kernel(scheduled: bool) -> None:
    """From ``pending`` (or ``reboot_scheduled``) for NEXT, reloading A makes A pending for
    its reboot into K; W is still known, carried for NEXT, so NEXT's cover stays ``ready``,
    and the history names W. A reload of A pending already is refused."""
    b = waiting_for_next()
    if scheduled:
        b = b.reboot_asked("asked")
    assert next_kernel_cover(b, NEXT) == "ready" and not b.awaits_reboot(K)
    after = b.reloading(A)
    assert (after.phase, after.active, after.pending) == (Phase.PENDING, A, A)
    assert after.awaits_reboot(K) and W in after.generations
    carried_gen = carried(after, NEXT)
    assert carried_gen is not None and carried_gen.id == W
    assert next_kernel_cover(after, NEXT) == "ready"
    assert W[:12] in after.history[-1].note
    with pytest.raises(IllegalTransition):
        after.reloading(A)


def test_a_drop_for_another_kernel_says_the_pending_one_stays_carried() -> None:
    """A drop for K taking the pending slot from W (for NEXT) says in the history that W
    stays carried for its kernel; one for the same kernel as the pending one, or one that
    retention forgets the pending one for, says nothing of the kind."""
    b = waiting_for_next().staged(Generation(C, "2", K, added=3.0), retain=3, installed={K, NEXT})
    assert b.pending == C and carried(b, NEXT) is not None
    assert f"{W[:12]} (for kernel {NEXT}) stays carried for its kernel" in b.history[-1].note
    again = b.staged(Generation("d" * 64, "3", K, added=4.0), retain=3, installed={K, NEXT})
    assert "stays carried" not in again.history[-1].note
    gone = waiting_for_next().staged(Generation(C, "2", K, added=3.0), retain=1, installed={K})
    assert W not in gone.generations and "stays carried" not in gone.history[-1].note


def test_reloading_waits_behind_a_generation_for_the_same_kernel() -> None:
    """A newer generation pending for K already has the reboot that brings a driver back:
    reloading A is refused and a refused drop changes nothing."""
    b = waiting_for_next().staged(Generation(C, "2", K, added=3.0), retain=3)
    with pytest.raises(IllegalTransition):
        b.reloading(A)
    assert b.after_refusal(REFUSED, unloaded=True) is b


def test_a_refused_drop_reloads_past_a_generation_for_another_kernel() -> None:
    """after_refusal with A's modules gone while W waits for NEXT: A is pending again with
    the refused drop recorded, W carried for NEXT; with A's modules still loaded nothing
    changes."""
    b = waiting_for_next()
    after = b.after_refusal(REFUSED, unloaded=True)
    assert (after.phase, after.pending, after.refused) == (Phase.PENDING, A, REFUSED)
    assert after.awaits_reboot(K) and next_kernel_cover(after, NEXT) == "ready"
    assert b.after_refusal(REFUSED, unloaded=False) is b


def _live_with_other_kernel_pending(host: Layout, signed: dict[str, Path], kernel: str) -> str:
    """``demo`` live on the running kernel, a generation for OTHER pending after it, and the
    running kernel's modules unloaded (a new pod's init container); the active id."""
    a = pending(host, kernel, [(signed["ms_params"], "")], bundle="demo")
    reboot(host)
    boot_with(host, FakeKernel(sys=host.sys)).run()
    b = load(host.state).bundle("demo")
    assert b.active == a and b.phase is Phase.ACTIVE and (host.sys / "module/ms_params").exists()
    w = other_kernel_generation(host, "1", added=b.generations[a].added + 10)
    b = replace(b, phase=Phase.PENDING, pending=w.id, generations={**b.generations, w.id: w})
    save(host.state, State({"demo": b}, boot_id=load(host.state).boot_id))
    shutil.rmtree(host.sys / "module/ms_params")
    return a


def test_a_redrop_of_the_unloaded_active_generation_awaits_its_reboot(
    host: Layout, signed: dict[str, Path], kernel: str
) -> None:
    """The same build dropped again after the unload is accepted and pending for the
    running kernel's reboot, and the generation it displaced is carried for OTHER."""
    a = _live_with_other_kernel_pending(host, signed, kernel)
    stage(
        host.incoming,
        bundle="demo",
        version="1",
        kernel=kernel,
        modules=[ModuleSpec(signed["ms_params"], "")],
    )
    [outcome] = make_intake(host).run()
    state = load(host.state)
    assert outcome.accepted and state.awaiting_reboot(kernel) == ["demo"]
    after = state.bundle("demo")
    assert (after.phase, after.pending) == (Phase.PENDING, a)
    assert next_kernel_cover(after, OTHER) == "ready"


def test_a_refused_drop_after_the_unload_awaits_the_reboot_that_reloads(
    host: Layout,
    modules: dict[str, Path],
    other_key: SigningKey,
    signed: dict[str, Path],
    kernel: str,
    tmp_path: Path,
) -> None:
    """A drop refused after the unload (signed by a key the host does not trust) makes the
    active generation pending for the running kernel's reboot; OTHER stays covered."""
    a = _live_with_other_kernel_pending(host, signed, kernel)
    bad = sign(modules["ms_params"], other_key, tmp_path / "ms_params.ko")
    stage(host.incoming, bundle="demo", version="2", kernel=kernel, modules=[ModuleSpec(bad, "")])
    [outcome] = make_intake(host).run()
    state = load(host.state)
    assert not outcome.accepted and "ENOKEY" in outcome.reasons[0]
    assert state.awaiting_reboot(kernel) == ["demo"]
    after = state.bundle("demo")
    assert (after.phase, after.pending) == (Phase.PENDING, a) and after.refused is not None
    assert next_kernel_cover(after, OTHER) == "ready"

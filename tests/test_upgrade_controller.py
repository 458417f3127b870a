"""The upgrade-controller stand-in (tests/vm/operator/upgrade_controller.py) makes the
decisions k8s-operator-libs' pkg/upgrade publishes, one state per reconcile."""

from __future__ import annotations

from tests.vm.operator.upgrade_controller import (
    Action,
    Container,
    Pod,
    State,
    UpgradeController,
    restarts_while_waiting,
)


def _pod(revision: str, ready: bool, restarts: int = 0, running: bool = True) -> Pod:
    return Pod(revision, running, (Container("nvidia-driver-ctr", ready, restarts),))


def _run(c: UpgradeController, pod: Pod | None, times: int, validator: bool = True) -> list:
    actions = []
    for i in range(times):
        actions += c.reconcile(float(i), pod, validator)
    return actions


def test_a_new_revision_walks_every_state_to_done_one_per_reconcile() -> None:
    """Out of sync: required, cordon, jobs, deletion, drain, restart (the old pod deleted);
    the new pod in sync and ready: validation, uncordon, done; each a reconcile apart."""
    c = UpgradeController("r1")
    c.reconcile(0, _pod("r1", True), True)
    assert c.state is State.DONE
    c.new_revision("r2")
    old = _pod("r1", True)
    actions = _run(c, old, 7)
    assert [s for _, s in c.history[1:]] == [
        State.UPGRADE_REQUIRED,
        State.CORDON_REQUIRED,
        State.WAIT_FOR_JOBS_REQUIRED,
        State.POD_DELETION_REQUIRED,
        State.DRAIN_REQUIRED,
        State.POD_RESTART_REQUIRED,
    ]
    assert actions == [Action.CORDON, Action.EVICT_GPU_PODS, Action.DELETE_DRIVER_POD]
    assert c.cordoned
    deleting = Pod("r1", True, old.containers, deleting=True)
    assert c.reconcile(8, deleting, True) == [] and c.state is State.POD_RESTART_REQUIRED
    c.reconcile(9, _pod("r2", False), True)  # new pod, not ready yet: it waits, no timeout
    assert c.state is State.POD_RESTART_REQUIRED
    c.reconcile(10, _pod("r2", True), True)
    assert c.state is State.VALIDATION_REQUIRED
    assert c.reconcile(11, _pod("r2", True), True) == [] and c.state is State.UNCORDON_REQUIRED
    assert c.reconcile(12, _pod("r2", True), True) == [Action.UNCORDON]
    assert c.state is State.DONE and not c.cordoned


def _at_pod_restart(revision: str = "r2") -> UpgradeController:
    c = UpgradeController("r1", State.DONE)
    c.new_revision(revision)
    _run(c, _pod("r1", True), 7)
    assert c.state is State.POD_RESTART_REQUIRED
    return c


def test_a_ready_pod_is_done_whatever_driver_it_runs() -> None:
    """Ready means Running and every container ready, in sync: nothing else is asked."""
    c = _at_pod_restart()
    c.reconcile(100, _pod("r2", True), True)
    assert c.state is State.VALIDATION_REQUIRED


def test_more_than_ten_restarts_of_an_unready_container_fail_the_upgrade() -> None:
    """10 restarts keep waiting; the 11th (restartCount > 10) is upgrade-failed; a ready pod
    later leaves it for uncordon; init containers count the same."""
    c = _at_pod_restart()
    c.reconcile(100, _pod("r2", False, restarts=10), True)
    assert c.state is State.POD_RESTART_REQUIRED
    c.reconcile(101, _pod("r2", False, restarts=11), True)
    assert c.state is State.FAILED
    c.reconcile(102, _pod("r2", False, restarts=12), True)
    assert c.state is State.FAILED and c.cordoned
    c.reconcile(103, _pod("r2", True, restarts=12), True)
    assert c.state is State.UNCORDON_REQUIRED
    d = _at_pod_restart()
    init = Pod("r2", False, (Container("ctr", False),), (Container("init", False, 11),))
    d.reconcile(100, init, True)
    assert d.state is State.FAILED


def test_a_not_running_pod_or_no_container_is_not_ready() -> None:
    """Pending, or no container status: still waiting."""
    c = _at_pod_restart()
    c.reconcile(100, _pod("r2", True, running=False), True)
    c.reconcile(101, Pod("r2", True, ()), True)
    assert c.state is State.POD_RESTART_REQUIRED


def test_validation_times_out_after_600_seconds() -> None:
    """Validator not ready: the clock starts on the first look, upgrade-failed past 600 s."""
    c = _at_pod_restart()
    c.reconcile(100, _pod("r2", True), False)
    c.reconcile(200, _pod("r2", True), False)
    c.reconcile(800, _pod("r2", True), False)
    assert c.state is State.VALIDATION_REQUIRED
    c.reconcile(801, _pod("r2", True), False)
    assert c.state is State.FAILED


def test_the_slot_waits_while_another_node_upgrades() -> None:
    """maxParallelUpgrades 1 with another node in progress: stays upgrade-required."""
    c = UpgradeController("r1", State.DONE, others_in_progress=1)
    c.new_revision("r2")
    _run(c, _pod("r1", True), 5)
    assert c.state is State.UPGRADE_REQUIRED
    c.others_in_progress = 0
    c.reconcile(9, _pod("r1", True), True)
    assert c.state is State.CORDON_REQUIRED


def test_a_node_cordoned_before_the_upgrade_stays_cordoned() -> None:
    """The initial-state annotation: validation goes straight to done, no uncordon."""
    c = UpgradeController("r1", State.DONE, cordoned=True)
    c.new_revision("r2")
    _run(c, _pod("r1", True), 7)
    c.reconcile(10, _pod("r2", True), True)
    assert c.reconcile(11, _pod("r2", True), True) == [] and c.state is State.DONE


def test_restarts_while_waiting_follow_the_probe_budget() -> None:
    """The operator's default probe (60 s + 10 s x 120) gives up every 1,260 s: a wait of
    4 hours restarts the container 11 times, one of 3 hours 8 times."""
    assert restarts_while_waiting(4 * 3600, 60, 10, 120) == 11
    assert restarts_while_waiting(3 * 3600, 60, 10, 120) == 8
    assert restarts_while_waiting(1259, 60, 10, 120) == 0

"""Stand-in for the GPU operator's driver upgrade controller, for one node.

The controller is NVIDIA/k8s-operator-libs ``pkg/upgrade`` (gpu-operator v26.7 vendors it):
on every reconcile ``ClusterUpgradeStateManagerImpl.ApplyState`` (upgrade_state.go) builds
the cluster's state once, grouping nodes by their ``nvidia.com/gpu-driver-upgrade-state``
label, then runs each ``Process*Nodes`` step in a fixed order over the nodes that were in
that step's state when the reconcile began. So a node moves at most one state per
reconcile; the controller requeues every 2 minutes and does not watch pods.

:meth:`UpgradeController.reconcile` applies those steps' decisions to one node, fed with
what the test observes of the driver pod (:class:`Pod`): its revision against the
DaemonSet's, its phase, each container's readiness and restart count. What the controller
does to the cluster (cordon, delete the driver pod) comes back as :class:`Action`; the test
carries it out (the DaemonSet's ``OnDelete`` strategy then starts the new pod). Only the
in-place mode with the operator's defaults is modelled: no ``waitForCompletion`` pod
selector, GPU pod deletion on, drain off, validation on (the validator's pod selector is
set by gpu-operator), one driver DaemonSet, no safe-load annotation, no requestor mode.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum

LABEL = "nvidia.com/gpu-driver-upgrade-state"  # consts.go: UpgradeStateLabelKeyFmt, "gpu"
VALIDATION_TIMEOUT = 600.0  # validation_manager.go: validationTimeoutSeconds
FAILING_RESTARTS = 10  # common_manager.go: isDriverPodFailing, RestartCount > 10
RECONCILE_PERIOD = 120.0  # gpu-operator's upgrade reconciler: requeue after 2 minutes


class State(StrEnum):
    """The label's values (consts.go ``UpgradeState*``), in the order a node moves."""

    UNKNOWN = ""
    UPGRADE_REQUIRED = "upgrade-required"
    CORDON_REQUIRED = "cordon-required"
    WAIT_FOR_JOBS_REQUIRED = "wait-for-jobs-required"
    POD_DELETION_REQUIRED = "pod-deletion-required"
    DRAIN_REQUIRED = "drain-required"
    POD_RESTART_REQUIRED = "pod-restart-required"
    VALIDATION_REQUIRED = "validation-required"
    UNCORDON_REQUIRED = "uncordon-required"
    DONE = "upgrade-done"
    FAILED = "upgrade-failed"


class Action(StrEnum):
    """What the controller does to the cluster in a reconcile (carried out by the test)."""

    CORDON = "cordon"  # CordonManager.Cordon
    EVICT_GPU_PODS = "evict-gpu-pods"  # PodManager.SchedulePodEviction
    DELETE_DRIVER_POD = "delete-driver-pod"  # PodManager.SchedulePodsRestart
    UNCORDON = "uncordon"  # CordonManager.Uncordon


@dataclass(frozen=True)
class Container:
    """One entry of the pod's ``containerStatuses`` or ``initContainerStatuses``."""

    name: str
    ready: bool
    restart_count: int = 0


@dataclass(frozen=True)
class Pod:
    """What the controller reads of the node's driver pod."""

    revision: str  # its controller-revision-hash label
    running: bool  # status.phase == Running
    containers: tuple[Container, ...]
    init_containers: tuple[Container, ...] = ()
    deleting: bool = False  # deletionTimestamp set


@dataclass
class UpgradeController:
    """One node's upgrade state under the controller, with the DaemonSet's revision.

    ``max_parallel`` is ``maxParallelUpgrades`` and ``others_in_progress`` the nodes
    already upgrading elsewhere (``GetUpgradesAvailable``); with one node and the default
    of 1 the node always gets its slot.
    """

    ds_revision: str
    state: State = State.UNKNOWN
    max_parallel: int = 1
    others_in_progress: int = 0
    initially_unschedulable: bool = False
    cordoned: bool = False
    validation_started: float | None = None
    history: list[tuple[float, State]] = field(default_factory=list)

    def _move(self, now: float, state: State) -> None:
        """NodeUpgradeStateProvider.ChangeNodeUpgradeState: set the label."""
        self.state = state
        self.history.append((now, state))

    def in_sync(self, pod: Pod | None) -> bool:
        """common_manager.go podInSyncWithDS: the pod's controller-revision-hash equals the
        DaemonSet's (an orphaned pod, none here, is never in sync)."""
        return pod is not None and pod.revision == self.ds_revision

    def driver_pod_in_sync(self, pod: Pod | None) -> bool:
        """common_manager.go isDriverPodInSync: in sync, Running, at least one container,
        and every container ready. The loaded driver's version is not looked at."""
        return (
            pod is not None
            and self.in_sync(pod)
            and pod.running
            and len(pod.containers) > 0
            and all(c.ready for c in pod.containers)
        )

    @staticmethod
    def driver_pod_failing(pod: Pod) -> bool:
        """common_manager.go isDriverPodFailing: any init container or container not ready
        with restartCount > 10."""
        return any(
            not c.ready and c.restart_count > FAILING_RESTARTS
            for c in (*pod.init_containers, *pod.containers)
        )

    def reconcile(self, now: float, pod: Pod | None, validator_ready: bool) -> list[Action]:
        """One ApplyState pass over this node (upgrade_state.go, in its order); returns
        what the controller did to the cluster."""
        start = self.state
        actions: list[Action] = []
        if start in (State.UNKNOWN, State.DONE):
            # common_manager.go ProcessDoneOrUnknownNodes: a pod out of sync means
            # upgrade-required; an unknown node whose pod is in sync is upgrade-done.
            if pod is not None and not self.in_sync(pod):
                self.initially_unschedulable = self.cordoned  # the initial-state annotation
                self._move(now, State.UPGRADE_REQUIRED)
            elif start is State.UNKNOWN:
                self._move(now, State.DONE)
        elif start is State.UPGRADE_REQUIRED:
            # upgrade_inplace.go ProcessUpgradeRequiredNodes: only with a free slot
            # (common_manager.go GetUpgradesAvailable: maxParallelUpgrades - in progress).
            # maxParallelUpgrades 0 means every upgrade-required node (this one) may start.
            available = 1 if self.max_parallel == 0 else self.max_parallel - self.others_in_progress
            if available > 0:
                self._move(now, State.CORDON_REQUIRED)
        elif start is State.CORDON_REQUIRED:
            # common_manager.go ProcessCordonRequiredNodes: cordon, then wait for jobs.
            self.cordoned = True
            actions.append(Action.CORDON)
            self._move(now, State.WAIT_FOR_JOBS_REQUIRED)
        elif start is State.WAIT_FOR_JOBS_REQUIRED:
            # common_manager.go ProcessWaitForJobsRequiredNodes: no pod selector to wait
            # for, so on to pod deletion (enabled by gpu-operator).
            self._move(now, State.POD_DELETION_REQUIRED)
        elif start is State.POD_DELETION_REQUIRED:
            # common_manager.go ProcessPodDeletionRequiredNodes -> pod_manager.go
            # SchedulePodEviction: GPU pods evicted (none fail here), then drain-required.
            actions.append(Action.EVICT_GPU_PODS)
            self._move(now, State.DRAIN_REQUIRED)
        elif start is State.DRAIN_REQUIRED:
            # common_manager.go ProcessDrainNodes: drain disabled, straight to pod restart.
            self._move(now, State.POD_RESTART_REQUIRED)
        elif start is State.POD_RESTART_REQUIRED:
            # common_manager.go ProcessPodRestartNodes, with no timeout of its own.
            if pod is not None and not self.in_sync(pod):
                if not pod.deleting:
                    actions.append(Action.DELETE_DRIVER_POD)
            elif self.driver_pod_in_sync(pod):
                self._move(now, State.VALIDATION_REQUIRED)  # IsValidationEnabled
            elif pod is not None and self.driver_pod_failing(pod):
                self._move(now, State.FAILED)
        elif start is State.FAILED:
            # common_manager.go ProcessUpgradeFailedNodes: leaves only once the pod is in
            # sync and ready (uncordon-required, or done when it was cordoned before).
            if self.driver_pod_in_sync(pod):
                self._move(
                    now, State.DONE if self.initially_unschedulable else State.UNCORDON_REQUIRED
                )
        elif start is State.VALIDATION_REQUIRED:
            # common_manager.go ProcessValidationRequiredNodes -> validation_manager.go
            # Validate/handleTimeout: the validator pods ready, or 600 s then upgrade-failed.
            if validator_ready:
                self.validation_started = None
                self._move(
                    now, State.DONE if self.initially_unschedulable else State.UNCORDON_REQUIRED
                )
            elif self.validation_started is None:
                self.validation_started = now
            elif now > self.validation_started + VALIDATION_TIMEOUT:
                self.validation_started = None
                self._move(now, State.FAILED)
        elif start is State.UNCORDON_REQUIRED:
            # upgrade_inplace.go ProcessUncordonRequiredNodes: uncordon, upgrade-done.
            self.cordoned = False
            actions.append(Action.UNCORDON)
            self._move(now, State.DONE)
        return actions

    def new_revision(self, revision: str) -> None:
        """The ClusterPolicy changed: the operator updates the DaemonSet's template."""
        self.ds_revision = revision


def restarts_while_waiting(wait: float, initial_delay: float, period: float, threshold: int) -> int:
    """How often the kubelet restarts a driver container that stays unready for ``wait``
    seconds: its startup probe gives up after ``initialDelaySeconds + periodSeconds x
    failureThreshold`` and the container is killed and started again (the kubelet's
    restart back-off only lengthens each round, so this is the most restarts there can be).
    """
    return int(wait // (initial_delay + period * threshold))

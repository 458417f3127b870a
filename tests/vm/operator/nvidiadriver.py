"""Stand-ins for the GPU operator's NVIDIADriver objects (tests/vm/test_nvidiadriver.py).

Each function applies one decision of NVIDIA/gpu-operator v26.7.0, read from its sources
(named per function): which object owns a
node (``internal/nvidiadriver/nvidiadriver.go``), how an object's nodes split into pools
(``internal/state/nodepool.go``), each pool's DaemonSet name, image and
``DRIVER_CONFIG_DIGEST`` (``internal/state/driver.go``, ``internal/config/
driver_config_digest.go``, ``internal/utils/utils.go``), and what the Kubernetes DaemonSet
controller does when a node's labels move it between pools. Values only: the test carries
out what they decide on its node. The pool name's hash and the digest are the operator's
own to the byte (``tests/test_nvidiadriver_standins.py`` checks them against the values
the operator's tests publish).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

OWNER_LABEL = "nvidia.com/gpu-operator.driver.owner"  # internal/consts: NVIDIADriverOwnerLabel
GPU_PRESENT = "nvidia.com/gpu.present"  # internal/consts: GPUPresentLabel
DEPLOY_DRIVER = "nvidia.com/gpu.deploy.driver"  # the driver DaemonSet's fixed node selector
OS_ID = "feature.node.kubernetes.io/system-os_release.ID"  # NFD, nodepool.go
OS_VERSION = "feature.node.kubernetes.io/system-os_release.VERSION_ID"
OS_MAJOR = "feature.node.kubernetes.io/system-os_release.VERSION_ID.major"
KERNEL = "feature.node.kubernetes.io/kernel-version.full"
MANAGER_IMAGE = "nvcr.io/nvidia/cloud-native/k8s-driver-manager:v0.12.0"
_ALPHANUMS = "bcdfghjklmnpqrstvwxz2456789"  # k8s.io/apimachinery util/rand SafeEncodeString
_APP_NAME_MAX = 63  # driver.go getDriverAppName: a DNS label


class ConflictingNodeSelector(Exception):
    """Two non-default NVIDIADrivers select one node: the operator changes no owner label
    at all (``AssignOwners`` fails closed) and both objects go NotReady."""


@dataclass(frozen=True)
class NVIDIADriver:
    """The parts of an NVIDIADriver's spec these decisions read (api/nvidia/v1alpha1)."""

    name: str
    uid: str
    repository: str
    image: str
    version: str
    driver_type: str = "gpu"
    node_selector: Mapping[str, str] = field(default_factory=dict)
    default: bool = False
    use_precompiled: bool = False
    kernel_module_config: str | None = None
    manager_image: str = MANAGER_IMAGE
    env: tuple[tuple[str, str], ...] = ()
    args: tuple[str, ...] = ()
    max_parallel_upgrades: int = 1  # GetUpgradePolicyWithDefaults with no policy: 1

    def selector(self) -> dict[str, str]:
        """nvidiadriver_types.go GetNodeSelector: no selector means every GPU node."""
        return dict(self.node_selector) or {GPU_PRESENT: "true"}


def _matches(labels: Mapping[str, str], selector: Mapping[str, str]) -> bool:
    return all(labels.get(k) == v for k, v in selector.items())


def assign_owners(
    drivers: Iterable[NVIDIADriver], nodes: Mapping[str, Mapping[str, str]]
) -> dict[str, str | None]:
    """nvidiadriver.go AssignOwners: each GPU node's owner, the one non-default object whose
    selector matches it, else the default object (None: no owner, the label removed).
    Raises :class:`ConflictingNodeSelector` before deciding any node when two match one."""
    drivers = list(drivers)
    defaults = [d.name for d in drivers if d.default]
    if len(defaults) > 1:
        raise ConflictingNodeSelector(f"multiple default NVIDIADrivers found: {defaults}")
    fallback = defaults[0] if defaults else None
    owners: dict[str, str | None] = {}
    for node, labels in nodes.items():
        if labels.get(GPU_PRESENT) != "true":
            continue
        matching = [d.name for d in drivers if not d.default and _matches(labels, d.selector())]
        if len(matching) > 1:
            raise ConflictingNodeSelector(
                f"multiple NVIDIADrivers match the same node {node}: {matching}"
            )
        owners[node] = matching[0] if matching else fallback
    return owners


def os_tag(os_id: str, version: str) -> str:
    """nodepool.go getOSTag: the image tag's OS part (no minor version for ol, rocky, rhel)."""
    suffix = version.split(".")[0] if os_id in ("ol", "rocky", "rhel") else version
    return f"{os_id}{suffix}"


@dataclass(frozen=True)
class Pool:
    """One node pool of an object (nodepool.go ``nodePool``)."""

    os_tag: str
    kernel: str  # only with usePrecompiled
    node_selector: Mapping[str, str]


def pools(driver: NVIDIADriver, nodes: Mapping[str, Mapping[str, str]]) -> list[Pool]:
    """nodepool.go getNodePools: the object's nodes (its selector, GPU present, owned by it)
    split by OS, and by full kernel version with usePrecompiled; nodes without NFD's labels
    are left out."""
    base = {**driver.node_selector, GPU_PRESENT: "true", OWNER_LABEL: driver.name}
    found: dict[tuple[str, str], Pool] = {}
    for labels in nodes.values():
        if not _matches(labels, base) or OS_ID not in labels or OS_VERSION not in labels:
            continue
        tag = os_tag(labels[OS_ID], labels[OS_VERSION])
        selector = {**base, OS_ID: labels[OS_ID]}
        if tag.endswith(labels[OS_VERSION]):
            selector[OS_VERSION] = labels[OS_VERSION]
        elif OS_MAJOR in labels:
            selector[OS_MAJOR] = labels[OS_MAJOR]
        else:
            continue
        kernel = ""
        if driver.use_precompiled:
            if KERNEL not in labels:
                continue
            kernel = selector[KERNEL] = labels[KERNEL]
        found.setdefault((tag, kernel), Pool(tag, kernel, selector))
    return list(found.values())


def fnv32a(data: bytes) -> int:
    """FNV-1a, 32 bits (Go's hash/fnv New32a)."""
    h = 0x811C9DC5
    for byte in data:
        h = ((h ^ byte) * 0x01000193) & 0xFFFFFFFF
    return h


def string_hash(text: str) -> str:
    """utils.go GetStringHash: FNV-1a 32 in decimal, each digit mapped by SafeEncodeString."""
    return "".join(_ALPHANUMS[ord(c) % len(_ALPHANUMS)] for c in str(fnv32a(text.encode())))


def app_name(driver: NVIDIADriver, pool: Pool) -> str:
    """driver.go getDriverAppName: the pool's DaemonSet, ``nvidia-<type>-driver-<os>-<hash>``,
    the hash of the object's UID (and ``-<kernel>`` for precompiled); the prefix is cut so
    the name stays a DNS label."""
    hashed = string_hash(driver.uid + (f"-{pool.kernel}" if pool.kernel else ""))
    prefix = f"nvidia-{driver.driver_type}-driver-{pool.os_tag}"
    name = f"{prefix}-{hashed}"
    if len(name) > _APP_NAME_MAX:
        name = f"{prefix[: _APP_NAME_MAX - len(hashed) - 1]}-{hashed}"
    return name


def image_path(driver: NVIDIADriver, pool: Pool) -> str:
    """nvidiadriver_types.go GetImagePath / GetPrecompiledImagePath: ``<repository>/<image>:
    <version>-<os>``, precompiled ``<version>-<kernel>-<os>``."""
    base = f"{driver.repository}/{driver.image}:{driver.version}"
    return f"{base}-{pool.kernel}-{pool.os_tag}" if pool.kernel else f"{base}-{pool.os_tag}"


def _spew(value: object) -> str:
    """go-spew's ``%#v`` (format.go) of the values a DriverInstallState holds: a type in
    parentheses, then the value; a slice's elements without their type; a struct's fields
    as ``Name:value``."""
    if isinstance(value, bool):
        return f"(bool){'true' if value else 'false'}"
    if isinstance(value, str):
        return f"(string){value}"
    if isinstance(value, tuple) and all(isinstance(v, str) for v in value):
        return "([]string)[" + " ".join(value) + "]"
    if isinstance(value, tuple):  # env: ((name, value), ...)
        items = (f"{{Name:(string){n} Value:(string){v}}}" for n, v in value)
        return "([]config.EnvVar)[" + " ".join(items) + "]"
    raise TypeError(f"no spew form for {value!r}")


def install_state(driver: NVIDIADriver, pool: Pool) -> dict[str, object]:
    """driver.go buildDriverInstallConfig: the DriverInstallState of the object's pool, its
    non-zero fields (no GDS, GDRCopy, RDMA, OpenShift, proxy or extra volumes here)."""
    fields: dict[str, object] = {
        "DriverImage": image_path(driver, pool),
        "DriverManagerImage": driver.manager_image,
        "DriverType": driver.driver_type,
        "DriverArgs": driver.args,
        "DriverEnv": tuple(sorted(driver.env)),
        "KernelModuleConfig": driver.kernel_module_config or "",
    }
    if pool.kernel:
        fields |= {"UsePrecompiled": True, "KernelVersion": pool.kernel}
    return {k: v for k, v in fields.items() if v not in ("", (), False)}


def config_digest(driver: NVIDIADriver, pool: Pool) -> str:
    """utils.go GetObjectHashIgnoreEmptyKeys of :func:`install_state`: FNV-1a 32 over each
    non-zero field, in field-name order, as ``Name:`` and its spew form; in decimal."""
    state = install_state(driver, pool)
    text = "".join(f"{name}:{_spew(state[name])}" for name in sorted(state))
    return str(fnv32a(text.encode()))


@dataclass(frozen=True)
class DaemonSet:
    """One pool's driver DaemonSet, as far as the node's pod depends on it."""

    name: str
    owner: str
    node_selector: Mapping[str, str]
    image: str
    digest: str
    version: str
    precompiled: bool

    @property
    def revision(self) -> str:
        """The template's controller-revision-hash (a stand-in: the template here is the
        image and the digest, so it changes exactly when they do)."""
        return str(fnv32a(f"{self.name}\0{self.image}\0{self.digest}".encode()))


def daemonsets(
    drivers: Iterable[NVIDIADriver], nodes: Mapping[str, Mapping[str, str]]
) -> dict[str, DaemonSet]:
    """Every pool's DaemonSet (driver.go getManifestObjects), by name; its node selector is
    ``nvidia.com/gpu.deploy.driver=true`` and the pool's (0500_daemonset.yaml)."""
    found = {}
    for driver in drivers:
        for pool in pools(driver, nodes):
            name = app_name(driver, pool)
            found[name] = DaemonSet(
                name,
                driver.name,
                {DEPLOY_DRIVER: "true", **pool.node_selector},
                image_path(driver, pool),
                config_digest(driver, pool),
                driver.version,
                bool(pool.kernel),
            )
    return found


def selecting(sets: Mapping[str, DaemonSet], labels: Mapping[str, str]) -> DaemonSet | None:
    """The DaemonSet whose node selector the node's labels match (the DaemonSet controller
    schedules its pod there); owners are unique, so at most one."""
    chosen = [ds for ds in sets.values() if _matches(labels, ds.node_selector)]
    assert len(chosen) <= 1, f"two driver DaemonSets select one node: {chosen}"
    return chosen[0] if chosen else None


ORPHANED = "(orphaned)"  # a driver pod whose DaemonSet was deleted with orphan propagation


def pod_moves(
    sets: Mapping[str, DaemonSet], labels: Mapping[str, str], running: str | None
) -> tuple[bool, DaemonSet | None]:
    """The Kubernetes DaemonSet controller for one node whose driver pod is ``running``
    (its DaemonSet's name; :data:`ORPHANED`; None: no pod): (delete that pod, the DaemonSet
    whose pod is to start). A pod whose DaemonSet no longer selects the node is deleted
    (SIGTERM); an orphaned pod has no DaemonSet controller and stays until someone deletes
    it. A new pod waits on the per-hostname anti-affinity (0500_daemonset.yaml) until no
    other driver pod object is on the node, so it starts only where none runs. The
    operator takes no part in this."""
    target = selecting(sets, labels)
    delete = running not in (None, ORPHANED) and (target is None or target.name != running)
    start = target if (running is None or delete) else None
    return delete, start


def label_orphaned(state: str) -> bool:
    """nodelabeling_controller.go labelNodesWithOrphanedDriverPods: a node running an
    orphaned ClusterPolicy driver pod and owned by a live NVIDIADriver is labelled
    ``upgrade-required`` when its upgrade state is unknown or ``upgrade-done``
    (isDriverUpgradeRequestAllowed), so the upgrade controller replaces the pod."""
    return state in ("", "upgrade-done")

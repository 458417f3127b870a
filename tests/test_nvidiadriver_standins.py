"""The NVIDIADriver stand-ins (tests/vm/operator/nvidiadriver.py) make the GPU operator's
published decisions: owners, pools, DaemonSet names, images, digests, pod moves."""

from __future__ import annotations

import pytest

from tests.vm.operator.nvidiadriver import (
    DEPLOY_DRIVER,
    GPU_PRESENT,
    KERNEL,
    ORPHANED,
    OS_ID,
    OS_VERSION,
    OWNER_LABEL,
    ConflictingNodeSelector,
    NVIDIADriver,
    Pool,
    app_name,
    assign_owners,
    config_digest,
    daemonsets,
    image_path,
    label_orphaned,
    pod_moves,
    pools,
)

UID = "bfac7359-6033-45ce-88d6-53db0078526e"  # internal/state/driver_test.go TestGetDriverAppName
MINIMAL = NVIDIADriver(
    "minimal",
    UID,
    "nvcr.io/nvidia",
    "driver",
    "525.85.03",
    manager_image="nvcr.io/nvidia/cloud-native/k8s-driver-manager:devel",
)


def _node(pool: str, **more: str) -> dict[str, str]:
    return {
        GPU_PRESENT: "true",
        DEPLOY_DRIVER: "true",
        OS_ID: "debian",
        OS_VERSION: "12",
        KERNEL: "6.1.0-41-amd64",
        "example.com/gpu-pool": pool,
        **more,
    }


def test_app_names_are_the_operators() -> None:
    """The pool DaemonSet's name is the operator's for the UID its tests use: the plain pool,
    the precompiled one (kernel in the hash), and a long OS cut to 63 characters."""
    plain = Pool("ubuntu20.04", "", {})
    assert app_name(MINIMAL, plain) == "nvidia-gpu-driver-ubuntu20.04-67cc6dbb79"
    kernel = Pool("ubuntu20.04", "5.15.0-70-generic", {})
    assert app_name(MINIMAL, kernel) == "nvidia-gpu-driver-ubuntu20.04-59b779bcc5"
    long = Pool("redhatCoreOS4.14-414.92.202309282257", "5.15.0-70-generic", {})
    name = app_name(MINIMAL, long)
    assert name == "nvidia-gpu-driver-redhatCoreOS4.14-414.92.2023092822-59b779bcc5"
    assert len(name) == 63


def test_digests_are_the_operators() -> None:
    """DRIVER_CONFIG_DIGEST is the operator's golden value for its minimal and precompiled
    render data (internal/state/testdata/golden/driver-{minimal,precompiled}.yaml)."""
    pool = Pool("ubuntu22.04", "", {})
    assert image_path(MINIMAL, pool) == "nvcr.io/nvidia/driver:525.85.03-ubuntu22.04"
    assert config_digest(MINIMAL, pool) == "886542011"
    pre = NVIDIADriver(
        "pre", UID, "nvcr.io/nvidia", "driver", "535", manager_image=MINIMAL.manager_image
    )
    pool = Pool("ubuntu22.04", "5.4.0-150-generic", {})
    assert image_path(pre, pool) == "nvcr.io/nvidia/driver:535-5.4.0-150-generic-ubuntu22.04"
    assert config_digest(pre, pool) == "648926272"


def test_a_digest_follows_its_inputs_and_not_the_object_name() -> None:
    """Version, kernel module config and env change the digest; the object's name, UID and
    selector do not (they are not DriverInstallState fields)."""
    pool = Pool("debian12", "", {})
    base = config_digest(MINIMAL, pool)
    for changed in (
        NVIDIADriver("m", UID, "nvcr.io/nvidia", "driver", "525.85.04"),
        NVIDIADriver("m", UID, "nvcr.io/nvidia", "driver", "525.85.03", kernel_module_config="p"),
        NVIDIADriver("m", UID, "nvcr.io/nvidia", "driver", "525.85.03", env=(("A", "1"),)),
    ):
        assert config_digest(changed, pool) != base
    renamed = NVIDIADriver(
        "other",
        "another-uid",
        "nvcr.io/nvidia",
        "driver",
        "525.85.03",
        node_selector={"x": "y"},
        manager_image=MINIMAL.manager_image,
    )
    assert config_digest(renamed, pool) == base


def test_owners_non_default_first_then_default_and_conflicts_fail_closed() -> None:
    """A node goes to the one non-default object selecting it, else the default; two
    matching make the whole assignment fail; nodes without a GPU get no owner."""
    a = NVIDIADriver("a", "ua", "r", "driver", "1", node_selector={"example.com/gpu-pool": "a"})
    b = NVIDIADriver("b", "ub", "r", "driver", "2", node_selector={"example.com/gpu-pool": "b"})
    dflt = NVIDIADriver("default", "ud", "r", "driver", "1", default=True)
    nodes = {"n1": _node("a"), "n2": _node("b"), "n3": _node("c"), "cpu": {"x": "y"}}
    assert assign_owners([a, b, dflt], nodes) == {"n1": "a", "n2": "b", "n3": "default"}
    assert assign_owners([a, b], nodes)["n3"] is None
    greedy = NVIDIADriver("greedy", "ug", "r", "driver", "3")  # no selector: every GPU node
    with pytest.raises(ConflictingNodeSelector, match="n1"):
        assign_owners([a, greedy], nodes)


def test_pools_split_by_os_and_by_kernel_with_precompiled() -> None:
    """One pool per OS; with usePrecompiled one per OS and kernel, the kernel in the
    selector, the DaemonSet name's hash and the image tag."""
    nodes = {
        "n1": {**_node("a"), OWNER_LABEL: "a"},
        "n2": {**_node("a", **{KERNEL: "6.1.0-42-amd64"}), OWNER_LABEL: "a"},
        "n3": {**_node("a", **{OS_VERSION: "13"}), OWNER_LABEL: "a"},
    }
    a = NVIDIADriver("a", "ua", "reg", "driver", "1", node_selector={"example.com/gpu-pool": "a"})
    assert sorted(p.os_tag for p in pools(a, nodes)) == ["debian12", "debian13"]
    pre = NVIDIADriver(
        "a", "ua", "reg", "driver", "1", node_selector={"example.com/gpu-pool": "a"},
        use_precompiled=True,
    )  # fmt: skip
    sets = daemonsets([pre], nodes)
    assert len(sets) == 3 and all(ds.precompiled for ds in sets.values())
    images = sorted(ds.image for ds in sets.values())
    assert images[0] == "reg/driver:1-6.1.0-41-amd64-debian12"
    assert all(ds.name.startswith("nvidia-gpu-driver-debian1") for ds in sets.values())


def test_a_label_move_deletes_the_old_pod_and_starts_the_new_pools() -> None:
    """A node whose labels move it from A's pool to B's: A's pod is deleted and B's pod is
    started (only once no other driver pod is on the node); an orphaned pod is never deleted
    by a DaemonSet controller and blocks the new pod; only done or unknown nodes are
    labelled upgrade-required for an orphaned pod."""
    a = NVIDIADriver("a", "ua", "reg", "driver", "1", node_selector={"example.com/gpu-pool": "a"})
    b = NVIDIADriver("b", "ub", "reg", "driver", "2", node_selector={"example.com/gpu-pool": "b"})
    labels = {**_node("a"), OWNER_LABEL: "a"}
    sets = daemonsets([a, b], {"n": labels})
    (ds_a,) = sets.values()
    assert pod_moves(sets, labels, ds_a.name) == (False, None)
    assert pod_moves(sets, labels, None) == (False, ds_a)
    assert pod_moves(sets, labels, ORPHANED) == (False, None)
    moved = {**_node("b"), OWNER_LABEL: "b"}
    sets = daemonsets([a, b], {"n": moved})
    (ds_b,) = sets.values()
    assert ds_b.owner == "b" and ds_b.digest != ds_a.digest
    assert pod_moves(sets, moved, ds_a.name) == (True, ds_b)
    assert label_orphaned("upgrade-done") and not label_orphaned("upgrade-failed")

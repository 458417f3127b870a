"""Each bundle's state as node labels through node-feature-discovery's feature file."""

from __future__ import annotations

import errno
import io
import re
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from service.boot.loader import Boot
from service.bundles.phase import Phase
from service.bundles.records import RefusedDrop
from service.bundles.state import BundleState, Generation, State
from service.cli import main
from service.config import Config, NodeLabels
from service.errors import ConfigError
from service.intake.scan import Intake
from service.layout import Layout
from service.publish.labels import (
    MAX_FILE_BYTES,
    bundle_labels,
    features_file,
    label_value,
    render,
    write_labels,
)
from service.verify.signature.trust import TrustStore
from stager.drop import ModuleSpec, stage
from tests.kmod import SigningKey, sign
from tests.service.fakes import FakeKernel, FakeKeyring, make_host

# The Kubernetes label syntax (k8s.io/apimachinery validation: IsQualifiedName, IsValidLabelValue)
K8S_NAME = re.compile(r"([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]\Z")
K8S_PREFIX = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*\Z")
K8S_VALUE = re.compile(r"(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?\Z")


def parse(text: str) -> dict[str, str]:
    """The labels nfd-worker reads from a feature file (``#`` lines are comments)."""
    out = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            key, _, value = line.partition("=")
            out[key] = value
    return out


def assert_valid_label(key: str, value: str) -> None:
    """``key=value`` is a label Kubernetes accepts."""
    prefix, _, name = key.partition("/")
    assert len(prefix) <= 253 and K8S_PREFIX.match(prefix), key
    assert len(name) <= 63 and K8S_NAME.match(name), key
    assert len(value) <= 63 and K8S_VALUE.match(value), (key, value)


bundle_names = st.from_regex(r"[a-z0-9][a-z0-9_-]{0,62}", fullmatch=True)
hostile_text = st.text(min_size=1, max_size=300)


@st.composite
def bundles(draw: st.DrawFn) -> BundleState:
    gens = {}
    for i, version in enumerate(draw(st.lists(hostile_text, min_size=1, max_size=3))):
        failed = draw(st.none() | hostile_text)
        gens[f"g{i}"] = Generation(f"g{i}", version, "k", added=float(i), failed=failed)
    ids = list(gens)
    return BundleState(
        phase=draw(st.sampled_from(Phase)),
        active=draw(st.sampled_from([None, *ids])),
        pending=draw(st.sampled_from([None, *ids])),
        generations=gens,
        deployed=draw(st.sampled_from([None, "gone", *ids])),
    )


@given(st.dictionaries(bundle_names, bundles(), max_size=6))
def test_every_key_and_value_is_a_valid_kubernetes_label(found: dict[str, BundleState]) -> None:
    """Whatever the versions and failure reasons hold (a container wrote them), each line
    is a valid label under the prefix, keys are distinct, and the file fits NFD's limit."""
    data = render(State(found), "modstage.io")
    labels = parse(data.decode())
    assert len(data) <= MAX_FILE_BYTES
    assert len(labels) == len(data.decode().splitlines()) - 1  # no key written twice
    for key, value in labels.items():
        assert key.startswith("modstage.io/")
        assert_valid_label(key, value)


@given(bundles())
def test_the_failed_label_is_the_deployed_generations_failure(bundle: BundleState) -> None:
    """Whatever is active, pending and deployed, ``<bundle>.failed`` is there exactly when
    :meth:`BundleState.deployed_failure` names a generation, and carries its reason."""
    labels = bundle_labels("nvidia", bundle)
    failed = bundle.deployed_failure()
    assert ("nvidia.failed" in labels) == (failed is not None)
    if failed is not None:
        assert labels["nvidia.failed"] == (label_value(str(failed.failed)) or "failed")


def _bundle(phase: Phase, *versions: tuple[str, str | None]) -> BundleState:
    gens = {
        f"g{i}": Generation(f"g{i}", v, "k", added=float(i), failed=f)
        for i, (v, f) in enumerate(versions)
    }
    return BundleState(phase=phase, generations=gens)


def test_a_bundles_phase_versions_and_failure_are_its_labels() -> None:
    """Phase, active and pending versions by value; a failed newest generation's reason
    shortened to a label value; keys of several bundles never collide."""
    failing = BundleState(
        phase=Phase.ACTIVE,
        active="g0",
        deployed="g1",
        generations={
            "g0": Generation("g0", "550.163.01", "k", added=1.0),
            "g1": Generation("g1", "1:2.0+deb13", "k", added=2.0, failed="nvidia: ENOEXEC: bad"),
        },
    )
    upgrading = BundleState(
        phase=Phase.PENDING,
        active="g0",
        pending="g1",
        generations={
            "g0": Generation("g0", "535.261.03", "k", added=1.0),
            "g1": Generation("g1", "550.163.01", "k", added=2.0),
        },
    )
    labels = parse(render(State({"nvidia": failing, "ib": upgrading}), "example.org").decode())
    assert labels == {
        "example.org/ib.phase": "pending",
        "example.org/ib.active": "535.261.03",
        "example.org/ib.pending": "550.163.01",
        "example.org/nvidia.phase": "active",
        "example.org/nvidia.active": "550.163.01",
        "example.org/nvidia.pending": "",
        "example.org/nvidia.failed": "nvidia-ENOEXEC-bad",
    }


def test_a_refused_drop_that_brought_the_last_good_back_is_a_label_until_one_is_accepted() -> None:
    """The active generation pending again after a refused drop: the labels say the phase,
    the version reloaded (active and pending alike) and ``rejected`` with the refused drop's
    reason; it stays once the reload is live (the rollout halts there) and goes when a drop
    is accepted."""
    refused = RefusedDrop(5.0, "modules/nvidia.ko: ENOKEY: no trusted key", "2", "g9", "d2")
    v1 = Generation("g0", "550.163.01", "k", added=1.0)
    live = BundleState(Phase.ACTIVE, active="g0", generations={"g0": v1})
    b = live.after_refusal(refused, unloaded=True)
    assert bundle_labels("nvidia", b) == {
        "nvidia.phase": "pending",
        "nvidia.active": "550.163.01",
        "nvidia.pending": "550.163.01",
        "nvidia.rejected": "modules-nvidia.ko-ENOKEY-no-trusted-key",
    }
    up = b.booting("g0").went_live("g0", ())
    assert (
        bundle_labels("nvidia", up)["nvidia.rejected"] == "modules-nvidia.ko-ENOKEY-no-trusted-key"
    )
    accepted = up.staged(Generation("g1", "560.1", "k", added=2.0), retain=3)
    assert "nvidia.rejected" not in bundle_labels("nvidia", accepted)


def test_long_bundle_names_keep_distinct_valid_keys() -> None:
    """Two 63-character names sharing a long start get distinct keys of at most 63."""
    a, b = "a" * 62 + "1", "a" * 62 + "2"
    labels = parse(render(State({a: BundleState(), b: BundleState()}), "modstage.io").decode())
    assert len(labels) == 6
    for key, value in labels.items():
        assert_valid_label(key, value)


def test_a_fleet_of_bundles_too_large_for_nfd_is_cut_and_says_so() -> None:
    """NFD skips a file over 64 KiB: bundles that do not fit are left out, and a label says."""
    many = {f"b{i:03d}-{'x' * 50}": _bundle(Phase.ACTIVE, ("v" * 60, "r" * 60)) for i in range(400)}
    data = render(State(many), "modstage.io")
    assert len(data) <= MAX_FILE_BYTES
    assert parse(data.decode())["modstage.io/labels.truncated"] == "true"


def test_written_only_where_nfd_is_installed_and_not_when_switched_off(tmp_path: Path) -> None:
    """No features.d: nothing written; switched off: nothing written; else the file, under
    the root, rewritten only when it changes, and a removed bundle's labels go with it."""
    layout = Layout(tmp_path)
    state = State({"nvidia": _bundle(Phase.ACTIVE, ("1", None)), "old": BundleState()})
    assert write_labels(layout, NodeLabels(), state) is None
    features_file(layout).parent.mkdir(parents=True)
    assert write_labels(layout, NodeLabels(enabled=False), state) is None
    path = write_labels(layout, NodeLabels(), state)
    assert path == tmp_path / "etc/kubernetes/node-feature-discovery/features.d/modstage"
    assert "modstage.io/old.phase" in parse(path.read_text())
    assert write_labels(layout, NodeLabels(), state) is None  # unchanged: not written again
    write_labels(layout, NodeLabels(), State({"nvidia": state.bundles["nvidia"]}))
    assert not any(k.startswith("modstage.io/old.") for k in parse(path.read_text()))
    assert [p.name for p in path.parent.iterdir()] == ["modstage"]  # no temporary left


@pytest.mark.parametrize(
    ("prefix", "why"),
    [
        ("nvidia.com", "under nvidia.com"),
        ("feature.node.kubernetes.io", "under kubernetes.io"),
        ("x.k8s.io", "under k8s.io"),
        ("Modstage.IO", "not a DNS subdomain"),
        ("a/b", "not a DNS subdomain"),
    ],
)
def test_a_prefix_the_operator_nfd_or_kubernetes_own_is_refused(prefix: str, why: str) -> None:
    """``[node_labels] prefix`` may not take over labels others own, nor be invalid."""
    with pytest.raises(ConfigError, match=f"node_labels.prefix: .*{why}"):
        Config.from_dict({"node_labels": {"prefix": prefix}})


@pytest.fixture
def nfd_host(tmp_path: Path, kernel: str, rsa_key: SigningKey) -> Layout:
    """A host tree with node-feature-discovery's features.d directory."""
    layout = make_host(tmp_path / "root", kernel, rsa_key.cert_pem)
    features_file(layout).parent.mkdir(parents=True)
    return layout


def test_intake_boot_failure_and_an_admins_hold_each_update_the_labels(
    nfd_host: Layout, modules: dict[str, Path], rsa_key: SigningKey, kernel: str, tmp_path: Path
) -> None:
    """The labels follow every state change: pending after intake, active after boot, the
    failure and the fallback after a failed boot (kept at a plain reboot and while a newer
    generation is only pending, gone once it comes up), and an admin's hold and release."""
    host = nfd_host
    trust = TrustStore.from_directory(host.trusted)
    good = sign(modules["ms_params"], rsa_key, tmp_path / "ms_params.ko")
    bad = sign(modules["ms_firmware"], rsa_key, tmp_path / "ms_firmware.ko")

    def labels() -> dict[str, str]:
        return parse(features_file(host).read_text())

    def take(version: str, module: Path) -> None:
        stage(host.incoming, bundle="nvidia", version=version, kernel=kernel,
              modules=[ModuleSpec(module)])  # fmt: skip
        [outcome] = Intake(host, Config(), trust, FakeKeyring(set())).run()
        assert outcome.accepted, outcome.reasons

    take("1.0", good)
    assert labels()["modstage.io/nvidia.phase"] == "pending"
    assert labels()["modstage.io/nvidia.pending"] == "1.0"
    Boot(host, Config(), trust, FakeKernel()).run()
    assert labels()["modstage.io/nvidia.active"] == "1.0"
    take("2.0", bad)
    Boot(host, Config(), trust, FakeKernel(fail={"ms_firmware": errno.ENODEV})).run()
    after = labels()
    assert after["modstage.io/nvidia.active"] == "1.0" and after["modstage.io/nvidia.pending"] == ""
    assert "ENODEV" in after["modstage.io/nvidia.failed"]
    assert main(["hold", "nvidia", "--root", str(host.root)], io.StringIO()) == 0
    assert labels()["modstage.io/nvidia.held"] == "true"
    assert main(["release", "nvidia", "--root", str(host.root)], io.StringIO()) == 0
    assert "modstage.io/nvidia.held" not in labels()
    Boot(host, Config(), trust, FakeKernel()).run()  # a plain reboot: 2.0's failure stands
    assert "ENODEV" in labels()["modstage.io/nvidia.failed"]
    take("3.0", good)
    assert "ENODEV" in labels()["modstage.io/nvidia.failed"]  # 3.0 is only pending
    Boot(host, Config(), trust, FakeKernel()).run()
    assert labels()["modstage.io/nvidia.active"] == "3.0"
    assert "modstage.io/nvidia.failed" not in labels()  # a newer generation came up

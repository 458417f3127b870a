"""Drops from one writer never change another's: a drop supersedes only drops in its own
incoming directory, and a drop whose directory names another bundle than its manifest
leaves every bundle's status and state as they were."""

from __future__ import annotations

import json
from pathlib import Path

from service.bundles.statefile import load
from service.config import Config
from service.layout import Layout
from stager.drop import ModuleSpec, stage
from tests.service.fakes import FakeKernel, boot_with, make_intake, pending

POD_DIR = "/run/nvidia/modstage/incoming"


def _drop(into: Path, bundle: str, version: str, kernel: str, module: Path) -> Path:
    """A drop of ``bundle`` with one module staged into ``into``."""
    return Path(
        stage(into, bundle=bundle, version=version, kernel=kernel, modules=[ModuleSpec(module, "")])
    )


def _pod_dir(host: Layout) -> tuple[Config, Path]:
    """A config with the host's incoming directory and a driver pod's, and the pod's."""
    config = Config.from_dict({"incoming_dirs": ["/var/lib/modstage/incoming", POD_DIR]})
    pod = host.root / POD_DIR.lstrip("/")
    pod.mkdir(parents=True)
    return config, pod


def test_a_later_named_drop_in_another_directory_removes_no_drop_here(
    host: Layout, signed: dict[str, Path], kernel: str
) -> None:
    """mofed's drop in the host's incoming directory, and in the pod's directory a drop
    named for mofed with a later time whose module does not match its manifest: the
    pod's drop is refused, and mofed's own drop is taken in, not superseded unjudged."""
    config, pod = _pod_dir(host)
    legit = _drop(host.incoming, "mofed", "1", kernel, signed["ms_params"])
    bogus = _drop(pod, "mofed", "2", kernel, signed["ms_params"])
    bogus = bogus.rename(pod / "mofed.99999999999999999999.ff")
    ko = next((bogus / "modules").iterdir())
    ko.chmod(0o644)
    ko.write_bytes(ko.read_bytes() + b"x")
    outcomes = make_intake(host, config).run()
    assert {o.drop.name: o.accepted for o in outcomes} == {legit.name: True, bogus.name: False}
    assert load(host.state).bundle("mofed").pending is not None


def test_a_drop_in_the_same_directory_still_supersedes_older_ones(
    host: Layout, signed: dict[str, Path], kernel: str
) -> None:
    """Two drops of a bundle for the same kernel in one directory: only the newer is
    taken in, the older is superseded (removed unjudged), as one writer's newest wins."""
    first = _drop(host.incoming, "mofed", "1", kernel, signed["ms_params"])
    second = _drop(host.incoming, "mofed", "2", kernel, signed["ms_params"])
    outcomes = make_intake(host).run()
    assert [(o.drop.name, o.accepted) for o in outcomes] == [(second.name, True)]
    assert not first.exists()


def test_a_drop_named_for_a_live_bundle_with_another_bundles_manifest_touches_neither(
    host: Layout, signed: dict[str, Path], kernel: str
) -> None:
    """mofed is active; a drop named for mofed whose manifest is for ``x`` is refused and
    quarantined, and mofed's status file and state are exactly as before."""
    pending(host, kernel, [(signed["ms_params"], "")], bundle="mofed")
    boot_with(host, FakeKernel(sys=host.sys)).run()
    before = load(host.state).bundle("mofed")
    status_before = json.loads((host.status / "mofed.json").read_text())
    bogus = _drop(host.incoming, "x", "1", kernel, signed["ms_exporter"])
    bogus = bogus.rename(bogus.with_name("mofed.99999999999999999999.ff"))
    [outcome] = make_intake(host).run()
    assert not outcome.accepted and outcome.bundle is None
    assert "directory is named for bundle 'mofed'" in outcome.reasons[0]
    assert load(host.state).bundle("mofed") == before
    assert json.loads((host.status / "mofed.json").read_text()) == status_before
    assert not (host.status / "x.json").exists()
    assert (host.quarantine / f"{bogus.name}.json").is_file()

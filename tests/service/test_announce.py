"""The host tells a driver pod and the cluster which kernel the next boot runs and which
bundles have a generation for it: ``status/_host.json`` (and its published copies) and the
node labels ``kernel.next`` and ``<bundle>.next``."""

from __future__ import annotations

import io
import json
from dataclasses import replace
from pathlib import Path

from service.bundles.phase import Phase
from service.bundles.state import Generation, State
from service.cli import main
from service.config import Config
from service.layout import kernel_image
from service.publish.announce import HOST_FILE
from service.publish.labels import features_file
from service.publish.operator import mirror_status
from tests.service.test_reboot_required import KERNEL, NEW, NEXT, active, host

PUBLISHED = "/run/nvidia/modstage/status"


def _node(root: Path, state: State, next_kernel: str | None = NEXT) -> Config:
    """A node running KERNEL with NEXT installed (the next boot's, by ``[kernel] next``),
    NFD's features.d present and one published status directory."""
    text = f'[publish]\nstatus_dirs = ["{PUBLISHED}"]\n'
    if next_kernel is not None:
        text += f'[kernel]\nnext = "{next_kernel}"\n'
    layout = host(root, state, text)
    layout.boot.mkdir(parents=True, exist_ok=True)
    for release in (KERNEL, NEXT):
        kernel_image(layout, release).write_bytes(b"MZ")
    features_file(layout).parent.mkdir(parents=True)
    return Config.load(layout.config)


def _labels(root: Path) -> dict[str, str]:
    from service.layout import Layout

    text = features_file(Layout(root)).read_text()
    return dict(line.split("=", 1) for line in text.splitlines() if not line.startswith("#"))


def test_the_host_file_and_labels_say_the_next_kernel_and_what_each_bundle_has_for_it(
    tmp_path: Path,
) -> None:
    """nvidia active on KERNEL, nothing for NEXT: ``_host.json`` (in the status directory and
    the published one, byte for byte) names the running and next kernel, how the next was
    decided, the installed kernels and ``nvidia: none``; the labels say
    ``kernel.next=6.12.0-next`` and ``nvidia.next=none``. A generation for NEXT pending makes
    both ``ready``; an admin's hold on it ``held``; the next boot running KERNEL again drops
    the ``<bundle>.next`` label."""
    from service.layout import Layout

    root = tmp_path / "node"
    config = _node(root, State({"nvidia": active()}))
    layout = Layout(root)
    mirror_status(layout, config)
    doc = json.loads((layout.status / HOST_FILE).read_text())
    published = layout.host(PUBLISHED) / HOST_FILE
    assert published.read_bytes() == (layout.status / HOST_FILE).read_bytes()
    assert (doc["running_kernel"], doc["next_kernel"], doc["next_kernel_how"]) == (
        KERNEL,
        NEXT,
        "config",
    )
    assert doc["installed"] == [NEXT, KERNEL] and doc["bundles"] == {"nvidia": {"next": "none"}}
    labels = _labels(root)
    assert labels["modstage.io/kernel.next"] == NEXT and labels["modstage.io/nvidia.next"] == "none"

    covered = active().with_generation(Generation(NEW, "2.0", NEXT, added=2.0))
    covered = covered.move(Phase.PENDING, pending=NEW)
    for bundle, said in ((covered, "ready"), (replace(covered, held=True), "held")):
        mirror_status(layout, config, State({"nvidia": bundle}))
        assert json.loads(published.read_text())["bundles"]["nvidia"]["next"] == said
        assert _labels(root)["modstage.io/nvidia.next"] == said

    again = _node(tmp_path / "same", State({"nvidia": active()}), next_kernel=KERNEL)
    mirror_status(Layout(tmp_path / "same"), again)
    labels = _labels(tmp_path / "same")
    assert labels["modstage.io/kernel.next"] == KERNEL and "modstage.io/nvidia.next" not in labels


def test_the_host_file_is_no_bundle_to_status(tmp_path: Path) -> None:
    """``status`` reads the bundles' status files only: ``_host.json`` beside them is not a
    garbled status of a bundle ``_host``, and the published copies carry no ``_host`` bundle."""
    from service.layout import Layout

    root = tmp_path / "node"
    config = _node(root, State({"nvidia": active()}))
    mirror_status(Layout(root), config)
    out = io.StringIO()
    main(["status", "--root", str(root), "--json"], out)
    doc = json.loads(out.getvalue())
    assert "_host" not in doc["bundles"] and not any(
        "_host" in p["reason"] for p in doc["problems"]
    )

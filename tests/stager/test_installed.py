"""``nvidia-driver init`` stages once for each other installed kernel the image carries
(:mod:`stager.other_kernels`): before the running kernel's drop, pending for another kernel
counts as success, a kernel the image lacks is named, and a restarted pod stages nothing
the host already has at this version."""

from __future__ import annotations

import json
import time
from pathlib import Path

from stager.schema.manifest import Manifest
from stager.schema.paths import MANIFEST_NAME
from tests.stager.test_driver import KERNEL, NEXT, _carry, _driver, _load, root

__all__ = ["root"]  # the fixture, used by name

OLD, LACK = "6.1.0-old-amd64", "6.1.0-lack-amd64"


def announce(root: Path, installed: list[str]) -> None:
    """``_host.json``: the next boot runs NEXT (the host has nothing for it), ``installed``."""
    status = root / "run/nvidia/modstage/status"
    status.mkdir(parents=True, exist_ok=True)
    doc = {
        "schema": 1,
        "running_kernel": KERNEL,
        "next_kernel": NEXT,
        "installed": installed,
        "bundles": {"nvidia": {"next": "none"}},
        "written": time.time(),
    }
    (status / "_host.json").write_text(json.dumps(doc))


def status_doc(root: Path, generations: dict[str, dict[str, str]], **more: object) -> None:
    """The pod's copy of ``status/nvidia.json`` listing ``generations``."""
    doc = {"bundle": "nvidia", "phase": "active", "updated": time.time() + 1, "errors": []}
    doc.update(generations=generations, running_kernel=KERNEL, **more)
    (root / "run/nvidia/modstage/status/nvidia.json").write_text(json.dumps(doc))


class Host:
    """Plays the host: takes each drop in as pending (for its kernel), or refuses those for
    kernels in ``refuse``; a drop for the running kernel goes active and loads."""

    def __init__(self, root: Path, refuse: tuple[str, ...] = ()) -> None:
        self.root, self.refuse, self.seen, self.generations = root, refuse, [], {}
        self.calls = 0

    def sleep(self, _seconds: float) -> None:
        self.calls += 1
        assert self.calls < 40, "the pod never decided"
        for drop in sorted((self.root / "run/nvidia/modstage/incoming").iterdir()):
            m = Manifest.from_toml((drop / MANIFEST_NAME).read_bytes())
            self.seen.append(m.kernel)
            if m.kernel in self.refuse:
                status_doc(
                    self.root,
                    self.generations,
                    phase="rejected",
                    drop=drop.name,
                    rejected={drop.name: "vermagic"},
                    errors=["vermagic"],
                )
            elif m.kernel == KERNEL:
                self.generations[m.digest] = {"version": m.version, "kernel": m.kernel}
                status_doc(self.root, self.generations, generation=m.digest, active=m.digest)
                _load(self.root, "nvidia", "2.0")
            else:
                self.generations[m.digest] = {"version": m.version, "kernel": m.kernel}
                status_doc(
                    self.root,
                    self.generations,
                    phase="pending",
                    generation=m.digest,
                    pending=m.digest,
                    pending_kernel=m.kernel,
                    active="a" * 64,
                )
            drop.rename(drop.parent.parent / f".taken-{drop.name}")


def test_a_loaded_pod_stages_once_for_each_installed_kernel_it_carries(root: Path) -> None:
    """Loaded on KERNEL, the host announcing KERNEL, OLD, NEXT and LACK installed: init stages
    one drop, for OLD (NEXT is the sleeping pod's, LACK is named as lacking), takes its
    pending for OLD as success and finishes; a restarted pod, the host listing that
    generation, stages nothing."""
    for release in (OLD, NEXT):
        _carry(root, release)
    announce(root, [NEXT, KERNEL, OLD, LACK])
    _load(root, "nvidia", "2.0")
    host = Host(root)
    driver, out = _driver(root, host)  # type: ignore[arg-type]
    assert driver.init(forever=lambda: None) == 0
    assert host.seen == [OLD]
    log = out.getvalue()
    assert f"kernel {OLD} is installed: staged" in log and f"waiting for kernel {OLD}" in log
    assert f"kernel {LACK} is installed on the host and this image carries no modules" in log
    assert "init goes on" not in log
    again, out = _driver(root, host)  # type: ignore[arg-type]
    assert again.init(forever=lambda: None) == 0
    assert host.seen == [OLD] and "staged" not in out.getvalue()


def test_the_installed_kernels_go_before_the_running_kernel_s_drop(root: Path) -> None:
    """Another version loaded: OLD's drop is staged and judged before the running kernel's
    (which keeps the host's one pending slot), and the running kernel's drop goes active."""
    _carry(root, OLD)
    announce(root, [KERNEL, OLD])
    _load(root, "nvidia", "1.0")
    host = Host(root)
    driver, _out = _driver(root, host)  # type: ignore[arg-type]
    assert driver.init(forever=lambda: None) == 0
    assert host.seen == [OLD, KERNEL]


def test_a_refusal_for_an_installed_kernel_is_said_and_init_goes_on(root: Path) -> None:
    """The host refuses OLD's drop: the pod says so and still finishes (its own driver is
    loaded); a generation of this version for OLD that failed is said, not staged again."""
    _carry(root, OLD)
    announce(root, [KERNEL, OLD])
    _load(root, "nvidia", "2.0")
    host = Host(root, refuse=(OLD,))
    driver, out = _driver(root, host)  # type: ignore[arg-type]
    assert driver.init(forever=lambda: None) == 0
    assert "drop rejected: vermagic" in out.getvalue() and "init goes on" in out.getvalue()
    gens = {"b" * 64: {"version": "2.0", "kernel": OLD, "failed": "ENOKEY"}}
    status_doc(root, gens)
    host.seen.clear()
    again, out = _driver(root, host)  # type: ignore[arg-type]
    assert again.init(forever=lambda: None) == 0
    assert host.seen == [] and f"nvidia 2.0 for installed kernel {OLD} failed" in out.getvalue()

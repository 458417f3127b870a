"""``nvidia-driver init`` waiting for its own bundle: the next kernel is looked after too."""

from __future__ import annotations

import json
import shutil
import time
from pathlib import Path

import pytest

from stager.schema.manifest import Manifest
from stager.schema.paths import MANIFEST_NAME
from tests.stager.test_driver import KERNEL, NEXT, _announce, _carry, _driver, _load, root

__all__ = ["root"]  # the fixture, shared with test_driver


class Stop(Exception):
    """Ends the pod's wait once the host has played its part."""


class PendingHost:
    """Takes each drop in: the running kernel's as pending (its reboot held by the gate),
    any other kernel's silently; the kernel update lands at the third sleep."""

    def __init__(self, root: Path, calls: int = 20) -> None:
        self.root, self.calls, self.last = root, 0, calls
        self.taken: list[tuple[int, str]] = []  # (sleep call, kernel of the drop)

    def sleep(self, _seconds: float) -> None:
        self.calls += 1
        if self.calls > self.last:
            raise Stop
        incoming = self.root / "run/nvidia/modstage/incoming"
        for drop in sorted(incoming.iterdir()):
            manifest = Manifest.from_toml((drop / MANIFEST_NAME).read_bytes())
            self.taken.append((self.calls, manifest.kernel))
            shutil.rmtree(drop)
            if manifest.kernel == KERNEL:
                gen = manifest.digest
                doc = {"bundle": "nvidia", "updated": time.time() + 1, "errors": []}
                doc.update(phase="pending", generation=gen, pending=gen)
                (self.root / "run/nvidia/modstage/status/nvidia.json").write_text(json.dumps(doc))
        if self.calls == 3:
            _announce(self.root, NEXT, cover="none")


def test_a_waiting_upgrade_pod_stages_for_the_next_kernel_at_its_cadence(root: Path) -> None:
    """An upgrade's pod (v1 loaded, v2 staged for the running kernel and pending) waits for
    its reboot when the host announces NEXT with no nvidia for it: the pod stages its image's
    NEXT modules once, after ``MODSTAGE_NEXT_KERNEL_EVERY`` seconds of waiting (10 s at 2 s a
    poll: after the fifth sleep, not at each poll), and keeps waiting for its own bundle."""
    _load(root, "nvidia", "1.0")
    _carry(root, NEXT)
    (root / "run/nvidia/modstage/status").mkdir(parents=True)
    host = PendingHost(root)
    driver, out = _driver(root, host, MODSTAGE_NEXT_KERNEL_EVERY="10")
    driver.wait_interval = 2.0
    with pytest.raises(Stop):
        driver.init(forever=lambda: None)
    assert host.taken == [(1, KERNEL), (6, NEXT)], out.getvalue()
    assert out.getvalue().count(f"the next boot runs kernel {NEXT}: staged") == 1


def test_a_failure_to_stage_for_the_next_kernel_is_said_and_the_wait_goes_on(
    root: Path,
) -> None:
    """Staging for NEXT fails while the pod waits (its modules unreadable): the pod says so
    and keeps waiting for its own bundle, trying again at the next period."""
    _load(root, "nvidia", "1.0")
    _carry(root, NEXT)
    (root / f"opt/modstage/modules/{NEXT}/nvidia.ko").write_bytes(b"not a module")
    (root / "run/nvidia/modstage/status").mkdir(parents=True)
    host = PendingHost(root, calls=12)
    driver, out = _driver(root, host, MODSTAGE_NEXT_KERNEL_EVERY="10")
    driver.wait_interval = 2.0
    with pytest.raises(Stop):
        driver.init(forever=lambda: None)
    assert host.taken == [(1, KERNEL)]
    assert out.getvalue().count("staging for the next kernel failed") == 2  # sleeps 5 and 10


class SlowHost(PendingHost):
    """Takes nothing in before the seventh sleep (its intake busy): the drops pile up."""

    def sleep(self, seconds: float) -> None:
        if self.calls < 6:
            self.calls += 1
            if self.calls == 3:
                _announce(self.root, NEXT, cover="none")
            return
        super().sleep(seconds)


def test_the_next_kernels_drop_leaves_the_pods_own_drop_in_incoming(root: Path) -> None:
    """The host has not taken the pod's own drop for the running kernel in when the pod
    stages for NEXT: both drops wait side by side and the host takes both in."""
    _load(root, "nvidia", "1.0")
    _carry(root, NEXT)
    (root / "run/nvidia/modstage/status").mkdir(parents=True)
    host = SlowHost(root, calls=10)
    driver, _out = _driver(root, host, MODSTAGE_NEXT_KERNEL_EVERY="10")
    driver.wait_interval = 2.0
    with pytest.raises(Stop):
        driver.init(forever=lambda: None)
    assert sorted(host.taken) == sorted([(7, KERNEL), (7, NEXT)])

"""Power cuts on a real kernel: qemu is killed during intake and during boot.

Unlike SIGKILL of a process (tests/hardening/test_crash.py), a power cut also loses what the
guest had not yet written through; the state share then holds exactly what reached the host.
After each cut the node boots again and must find: state.json parsing, no unverified file
under a published generation name, the staged bundle not lost, and the next run completing.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from service.layout import Layout
from service.store.phase import Phase
from stager.manifest import Manifest
from tests.hardening.invariants import not_lost, published_problems, state_of
from tests.kmod import SigningKey, kernel_release, make_key, padded_module, sign
from tests.vm.harness import Vm, VmFactory
from tests.vm.node import drop, live_modules, modstage, prepare

pytestmark = pytest.mark.vm
KERNEL = kernel_release()
INTAKE = (
    "import subprocess, sys\n"
    "job = subprocess.Popen([sys.executable, '-m', 'service.cli', '{command}'],"
    " stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)\n"
)


@pytest.fixture(scope="module")
def key(tmp_path_factory: pytest.TempPathFactory) -> SigningKey:
    """The vendor's key."""
    return make_key(tmp_path_factory.mktemp("cut-key"), "rsa4096", cn="power cut vendor")


@pytest.fixture
def node(boot_vm: VmFactory) -> Iterator[Vm]:
    """A node of its own: its power is cut."""
    vm = boot_vm("powercut")
    yield vm
    vm.close()


def _layout(vm: Vm, tmp_path: Path) -> Layout:
    """A host-side Layout whose var directory is the node's state share."""
    root = tmp_path / "view"
    (root / "var/lib").mkdir(parents=True)
    (root / "var/lib/modstage").symlink_to(vm.state_dir)
    return Layout(root)


def _cut_when(vm: Vm, condition: object, timeout: float = 240) -> float:
    """Kill qemu as soon as ``condition()`` holds on the host side; return when."""
    started = time.monotonic()
    while not condition():  # type: ignore[operator]
        assert time.monotonic() - started < timeout, "the step never started"
        time.sleep(0.05)
    vm.kill()
    return time.monotonic() - started


def test_power_cut_during_intake_and_boot(
    node: Vm, key: SigningKey, test_modules: dict[str, Path], tmp_path: Path
) -> None:
    """Cut power while intake copies a 48 MiB bundle, and while boot loads it; both recover."""
    certs = {"vendor.pem": key.cert_pem.read_bytes()}
    big = sign(
        padded_module(test_modules["ms_params"], tmp_path / "pad.ko", 48 << 20),
        key,
        tmp_path / "ms_params.ko",
    )
    small = sign(test_modules["ms_exporter"], key, tmp_path / "ms_exporter.ko")
    dropped = drop(node, "test", "1", KERNEL, [(small, ""), (big, "count=3")])
    gen_id = Manifest.from_toml((dropped / "manifest.toml").read_bytes()).digest
    layout = _layout(node, tmp_path)
    prepare(node, certs)
    node.python(INTAKE.format(command="intake"))
    store = node.state_dir / "store"
    _cut_when(node, lambda: store.is_dir() and any(store.glob(".tmp-*/modules/*")))

    assert state_of(layout).bundle("test").pending is None  # the cut came before the record
    assert published_problems(layout) == []
    assert not_lost(layout, "test", gen_id)
    node.start()
    prepare(node, certs)
    rc, out = modstage(node, "intake")
    assert rc == 0, out
    assert state_of(layout).bundle("test").pending == gen_id
    assert published_problems(layout) == [] and not list(store.glob(".tmp-*"))

    node.reboot()
    prepare(node, certs)
    node.python(INTAKE.format(command="boot"))
    _cut_when(node, lambda: state_of(layout).bundle("test").phase is Phase.LOADING)

    b = state_of(layout).bundle("test")
    assert (b.phase, b.generations[gen_id].attempts) == (Phase.LOADING, 1)
    assert published_problems(layout) == []
    node.start()
    prepare(node, certs)
    rc, out = modstage(node, "boot")
    assert rc == 0, out
    b = state_of(layout).bundle("test")
    assert (b.phase, b.active, b.pending) == (Phase.ACTIVE, gen_id, None)
    assert {"ms_exporter", "ms_params"} <= set(live_modules(node))
    assert node.read("/sys/module/ms_params/parameters/count") == "3"

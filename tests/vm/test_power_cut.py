"""Power cuts on a real kernel: qemu is killed during intake, right after it, during boot and
right after it.

Unlike SIGKILL of a process (tests/hardening/test_crash.py), a power cut also loses what the
guest had not yet written back. So the node's state directory is not the 9p share here (it
writes through to the host's page cache, which outlives qemu) but an ext4 disk: a host image
on virtio with cache=none (tests/vm/harness/disk.py), mounted with a 600 s journal commit
interval, so that only an fsync makes a change durable within a test. After each cut the
node boots again (the mount replays the journal) and must find: state.json parsing, no
unverified file under a published generation name, the staged bundle not lost, and every
change a finished command recorded still there.

The control runs intake with ``MODSTAGE_FAULT_SKIP_FSYNC=1`` (stager/schema/atomic.py), which skips
every fsync modstage makes (the state, the status files, the store's directories and the
copied modules: tests/stager/test_atomic_faults.py checks that no other module calls
``os.fsync``): its record dies with the power, so the check that the real run passes fails
there, which shows the test sees a missing fsync. Both tests share one node (one disk), the control second: the first
intake on a fresh disk builds the exports cache (minutes under TCG), and the control finds it
built and durable (run alone, it builds it itself).

On both kernels (Debian 12's 6.1; Debian 13's 6.12 in its own root, whose init loads
virtio_blk and ext4 from that root's `.ko.xz` tree): the bundle's modules are built and
signed for the node's kernel, and the exports cache is the one the harness built from the
node's own root. No expectation differs between the kernels: the fsyncs are modstage's and
ext4's, not the module loader's.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.kmod import SigningKey, make_key, padded_module
from tests.vm.harness import Vm, VmFactory, kmod
from tests.vm.harness.disk import make_ext4_image
from tests.vm.harness.kernel import Kernel
from tests.vm.node import live_modules, prepare

pytestmark = [pytest.mark.vm, pytest.mark.kernels("6.1", "6.12")]
TRACE = "/run/modstage-trace"  # tmpfs: the fault points a background command passed
RUN = (  # a modstage command in the background (the agent stays free to watch it)
    "import os, subprocess, sys\n"
    "job = subprocess.Popen([sys.executable, '-m', 'service.cli', {command!r}],"
    " env={{**os.environ, **{env!r}}},"
    " stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)\n"
)
GUEST = '''
import json, os, subprocess, sys, time
from pathlib import Path
from service.layout import Layout
from tests.hardening.invariants import not_lost, published_problems, state_of

_layout = Layout(Path("/"))


def _phase(bundle):
    return state_of(_layout).bundle(bundle).phase.value


def _view(bundle, generation, deep):
    """What the checks need of the node's state, as JSON values (``deep``: hash the store)."""
    try:
        b = state_of(_layout).bundle(bundle)
    except Exception as exc:  # torn
        return {"state": f"unreadable: {exc!r}"}
    gen = b.generations.get(generation)
    return {
        "state": "readable",
        "phase": b.phase.value,
        "pending": b.pending,
        "active": b.active,
        "attempts": None if gen is None else gen.attempts,
        "problems": published_problems(_layout) if deep else None,
        "not_lost": not_lost(_layout, bundle, generation),
        "temporaries": sorted(p.name for p in _layout.store.glob(".tmp-*")),
    }


def _points(trace):
    """The fault points a command passed so far (MODSTAGE_FAULT_TRACE, service/faults.py)."""
    return open(trace).read().split() if os.path.exists(trace) else []


def _until(condition, timeout):
    started = time.monotonic()
    while not condition():
        if time.monotonic() - started > timeout:
            return False
        time.sleep(0.05)
    return True


def _stage(bundle, specs, kernel):
    from stager.drop import ModuleSpec, stage
    from stager.schema.manifest import Manifest

    _layout.incoming.mkdir(exist_ok=True)
    drop = stage(_layout.incoming, bundle=bundle, version="1", kernel=kernel,
                 modules=[ModuleSpec(Path(p), params) for p, params in specs])
    return Manifest.from_toml((drop / "manifest.toml").read_bytes()).digest


def _modstage(command, env):
    done = subprocess.run([sys.executable, "-m", "service.cli", command], capture_output=True,
                          text=True, env={**os.environ, **env})
    return done.returncode, done.stdout + done.stderr
'''
SKIP_FSYNC = {"MODSTAGE_FAULT_SKIP_FSYNC": "1"}


@pytest.fixture(scope="module")
def key(tmp_path_factory: pytest.TempPathFactory) -> SigningKey:
    """The vendor's key."""
    return make_key(tmp_path_factory.mktemp("cut-key"), "rsa4096", cn="power cut vendor")


@pytest.fixture(scope="module")
def node(boot_vm: VmFactory, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Vm]:
    """A node of its own whose /var/lib/modstage is a fresh ext4 disk: its power is cut."""
    image = make_ext4_image(tmp_path_factory.mktemp("powercut-disk") / "state.img")
    vm = boot_vm("powercut", state_disk=image)
    yield vm
    vm.close()


def _up(vm: Vm, certs: dict[str, bytes]) -> None:
    """After a boot: the trust and config in /etc, and the guest-side helpers."""
    prepare(vm, certs)
    vm.python(GUEST)


def _stage(vm: Vm, bundle: str, modules: list[tuple[Path, str]]) -> str:
    """Stage a bundle for the node's kernel from the guest, as a driver container writes to
    the node's disk (with its own fsyncs); returns the generation id."""
    specs = [(vm.put(path, f"src/{path.name}"), params) for path, params in modules]
    release = vm.kernel.release
    return str(vm.eval(f"_stage({bundle!r}, {specs!r}, {release!r})", timeout=240))


def _view(vm: Vm, bundle: str, generation: str, *, deep: bool = True) -> dict[str, Any]:
    """The node's state of ``bundle``, read in the guest; ``deep`` also checks every published
    generation against its manifest (hashing the store: seconds for 48 MiB under TCG)."""
    return dict(vm.eval(f"_view({bundle!r}, {generation!r}, {deep!r})", timeout=120))


def _cut_when(vm: Vm, condition: str, timeout: float = 240) -> float:
    """Kill qemu as soon as the guest sees ``condition`` hold; return when."""
    started = time.monotonic()
    assert vm.eval(f"_until(lambda: {condition}, {timeout})", timeout=timeout + 30), (
        f"the step never started: {condition}"
    )
    vm.kill()
    return time.monotonic() - started


def _restart(vm: Vm, certs: dict[str, bytes]) -> None:
    """Power on after a cut: the disk's journal is replayed by the mount, /etc is rebuilt."""
    vm.start()
    _up(vm, certs)


def _run_then_cut(
    vm: Vm, certs: dict[str, bytes], command: str, bundle: str, generation: str, env: dict[str, str]
) -> tuple[dict[str, Any], dict[str, Any]]:
    """Run ``modstage COMMAND`` to its end, cut the power at once, boot again; the state as
    the guest saw it before the cut (its page cache), and after."""
    rc, out = vm.eval(f"_modstage({command!r}, {env!r})", timeout=420)
    assert rc == 0, out
    before = _view(vm, bundle, generation, deep=False)
    vm.kill()
    _restart(vm, certs)
    return before, _view(vm, bundle, generation)


def _recorded(seen: dict[str, Any], generation: str) -> bool:
    """Intake's record: the generation pending, published whole, no temporary left."""
    return bool(
        seen["state"] == "readable"
        and seen["pending"] == generation
        and seen["problems"] == []
        and seen["temporaries"] == []
    )


def test_power_cut_during_intake_and_boot(
    node: Vm, kernel: Kernel, key: SigningKey, test_modules: dict[str, Path], tmp_path: Path
) -> None:
    """Cut power while intake copies a 48 MiB bundle, once it recorded it, while boot loads
    it and once boot recorded it active; each time the node recovers and nothing recorded is
    lost."""
    certs = {"vendor.pem": key.cert_pem.read_bytes()}
    big = kmod.sign(
        kernel,
        padded_module(test_modules["ms_params"], tmp_path / "pad.ko", 48 << 20),
        key,
        tmp_path / "ms_params.ko",
    )
    small = kmod.sign(kernel, test_modules["ms_exporter"], key, tmp_path / "ms_exporter.ko")
    _up(node, certs)
    gen_id = _stage(node, "test", [(small, ""), (big, "count=3")])
    node.python(RUN.format(command="intake", env={}))
    _cut_when(node, "any(_layout.store.glob('.tmp-*/modules/*'))")

    _restart(node, certs)
    seen = _view(node, "test", gen_id)
    assert seen["pending"] is None  # the cut came before the record
    assert seen["problems"] == [] and seen["not_lost"]

    before, after = _run_then_cut(node, certs, "intake", "test", gen_id, env={})
    assert before["pending"] == gen_id, f"intake did not record it: {before}"
    assert _recorded(after, gen_id), f"intake's record did not survive the cut: {after}"

    node.python(RUN.format(command="boot", env={"MODSTAGE_FAULT_TRACE": TRACE}))
    _cut_when(node, f"'state.loading.saved' in _points({TRACE!r})")

    _restart(node, certs)
    seen = _view(node, "test", gen_id)
    assert (seen["phase"], seen["attempts"]) == ("loading", 1)
    assert seen["problems"] == []

    rc, out = node.eval("_modstage('boot', {})", timeout=420)
    assert rc == 0, out
    assert {"ms_exporter", "ms_params"} <= set(live_modules(node))
    assert node.read("/sys/module/ms_params/parameters/count") == "3"
    seen = _view(node, "test", gen_id, deep=False)
    assert (seen["phase"], seen["active"], seen["pending"]) == ("active", gen_id, None)
    node.kill()
    _restart(node, certs)
    seen = _view(node, "test", gen_id)
    assert (seen["phase"], seen["active"], seen["pending"]) == ("active", gen_id, None)
    assert seen["problems"] == []


def test_control_intake_without_fsync_loses_its_record(
    node: Vm, kernel: Kernel, key: SigningKey, test_modules: dict[str, Path], tmp_path: Path
) -> None:
    """With every fsync modstage makes skipped (stager/schema/atomic.py's switch), intake's record is
    in the guest before the cut and lost (or torn) after it: the check the real run passes
    fails."""
    certs = {"vendor.pem": key.cert_pem.read_bytes()}
    small = kmod.sign(kernel, test_modules["ms_enodev"], key, tmp_path / "ms_enodev.ko")
    if not node.running:  # the test above failed midway
        node.start()
    _up(node, certs)
    gen_id = _stage(node, "control", [(small, "")])

    before, after = _run_then_cut(node, certs, "intake", "control", gen_id, env=SKIP_FSYNC)
    assert before["pending"] == gen_id and before["temporaries"] == [], f"not recorded: {before}"
    assert not _recorded(after, gen_id), f"an intake without fsync survived the cut: {after}"
    lost_or_torn = after["state"] != "readable" or after["pending"] is None
    assert lost_or_torn, f"neither lost nor torn: {after}"

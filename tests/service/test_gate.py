"""The next kernel's reboot gate in the daemon: a reboot modstage itself would ask for waits
while the next boot's kernel has no generation of a bundle that has a driver now, and goes
through once ``[kernel] hold_max`` has passed since that kernel was installed."""

from __future__ import annotations

import json
from pathlib import Path

from service.bundles.phase import Phase
from service.bundles.state import Generation, State
from service.bundles.statefile import load
from service.config import Config, KernelChoice, RebootConfig
from service.daemon.clock import SystemClock
from service.daemon.loop import Daemon
from service.intake.scan import Intake
from service.layout import Layout, kernel_image, modules_dir
from service.rebooting.gate import gate_for
from service.rebooting.request import CommandRebooter
from service.rebooting.window import Guard
from service.verify.signature.trust import TrustStore
from stager.drop import ModuleSpec, stage
from tests.service.conftest import HostTree
from tests.service.fake_clock import FakeClock
from tests.service.fakes import FakeKernel, FakeKeyring, FakeSysfs, boot_with

NEXT = "6.12.0-next"


def _install_next(host: Layout) -> float:
    """Kernel NEXT installed now (its image and module tree); the image's change time."""
    host.boot.mkdir(parents=True, exist_ok=True)
    kernel_image(host, NEXT).write_bytes(b"MZ")
    modules_dir(host, NEXT).mkdir(parents=True)
    return kernel_image(host, NEXT).stat().st_ctime


def _active(host: Layout, module: Path, kernel: str) -> None:
    """Bundle ``test`` with generation 1 taken in and booted: a driver the node has now."""
    stage(host.incoming, bundle="test", version="1", kernel=kernel, modules=[ModuleSpec(module)])
    cfg = Config()
    Intake(host, cfg, TrustStore.from_directory(host.trusted), FakeKeyring(set())).run()
    assert boot_with(host, FakeKernel(sys=host.sys)).run().bundle("test").phase is Phase.ACTIVE


def test_the_daemon_holds_its_reboot_for_the_next_kernel_until_hold_max(
    host_tree: HostTree, module: Path, kernel: str
) -> None:
    """Generation 2 of ``test`` pending for the running kernel wants a reboot, but the next
    boot runs NEXT (installed a minute ago, ``[kernel] next``) where ``test`` has nothing:
    the daemon does not ask, and its heartbeat names the kernel and the bundle; an hour
    (``hold_max``) after NEXT was installed it asks, once."""
    host = host_tree()
    _active(host, module, kernel)
    installed = _install_next(host)
    clock = FakeClock(wall=installed + 60)
    asked: list[float] = []
    config = Config(
        reboot=RebootConfig(backend="command", guard=Guard(min_delay=0, min_interval=86400)),
        kernel=KernelChoice(next=NEXT, hold_max=3600),
    )
    intake = Intake(host, config, TrustStore.from_directory(host.trusted), FakeKeyring(set()))
    rebooter = CommandRebooter(lambda: [["reboot-now"]], runner=lambda _: asked.append(clock.wall))
    daemon = Daemon(host, config, intake, rebooter, clock=clock, sysfs=FakeSysfs(host.sys))  # type: ignore[arg-type]
    stage(host.incoming, bundle="test", version="2", kernel=kernel, modules=[ModuleSpec(module)])
    clock.run_for(1)
    daemon.loop()
    assert load(host.state).bundle("test").phase is Phase.PENDING and asked == []
    decision = json.loads(host.heartbeat.read_text())["reboot_decision"]
    assert decision.startswith(f"held: the next boot runs kernel {NEXT} and test has no"), decision
    clock.run_for(3600)
    daemon.loop()
    # (the fake clock reaches the bound by float sums: within a millisecond of it)
    assert len(asked) == 1 and installed + 3600 - 1e-3 <= asked[0] <= installed + 3600 + 60
    assert load(host.state).bundle("test").phase is Phase.REBOOT_SCHEDULED


def test_the_gate_is_open_for_the_running_kernel_an_unknown_one_and_a_covered_one(
    host_tree: HostTree, module: Path, kernel: str
) -> None:
    """No gate when the next boot runs the running kernel again, when modstage cannot tell
    the next kernel (``[kernel] next`` names one with no image), or once the bundle has a
    generation for NEXT pending (as intake records one judged against NEXT's tree); with ``hold_max = 0`` the gate exists but never holds."""
    host = host_tree()
    _active(host, module, kernel)
    state = load(host.state)

    def gate(**choice: object) -> object:
        now = SystemClock().now().timestamp()
        return gate_for(host, Config(kernel=KernelChoice(**choice)), state, kernel, now)  # type: ignore[arg-type]

    assert gate(next=NEXT) is None  # NEXT has no image yet: the next kernel is unknown
    _install_next(host)
    found = gate(next=NEXT)
    assert found is not None and found.holds and found.bundles == ("test",)  # type: ignore[attr-defined]
    assert gate(next=kernel) is None
    never = gate(next=NEXT, hold_max=0)
    assert never is not None and not never.holds  # type: ignore[attr-defined]
    b = state.bundle("test")
    covered = b.with_generation(Generation("b" * 64, "2", NEXT, added=2.0))
    state = State({"test": covered.move(Phase.PENDING, pending="b" * 64)})
    assert gate(next=NEXT) is None

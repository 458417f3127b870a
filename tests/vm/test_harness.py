"""The harness itself: outputs, errors and deadlines come back cleanly, and a dead guest is
reported with its serial console instead of hanging the run."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.vm.harness import CommandTimeout, GuestError, Vm, VmBootError, VmExited, VmFactory
from tests.vm.harness.kernel import Kernel

REPO = Path(__file__).resolve().parents[2]

pytestmark = [pytest.mark.vm, pytest.mark.kernels("6.1", "6.12", "7.2")]


def test_run_returns_status_and_both_streams(vm: Vm) -> None:
    """A shell command's exit status, stdout and stderr come back separately."""
    result = vm.run("echo out; echo err >&2; exit 3")
    assert (result.rc, result.stdout, result.stderr) == (3, "out\n", "err\n")
    assert vm.run(["cat"], input="piped").stdout == "piped"


def test_guest_exception_carries_its_traceback(vm: Vm) -> None:
    """Python raising in the guest surfaces as GuestError with the guest's traceback."""
    with pytest.raises(GuestError, match="ZeroDivisionError"):
        vm.eval("1 / 0")


def test_timeouts_leave_the_guest_usable(vm: Vm) -> None:
    """An overrunning command or Python call raises CommandTimeout within its deadline; the
    agent keeps answering."""
    began = time.monotonic()
    with pytest.raises(CommandTimeout):
        vm.run("sleep 60", timeout=1)
    with pytest.raises(CommandTimeout):
        vm.python("import time\ntime.sleep(60)", timeout=1)
    assert time.monotonic() - began < 20
    assert vm.eval("6 * 7") == 42


def test_namespace_lives_for_the_boot(vm: Vm) -> None:
    """Names defined by one python() call are visible to the next (e.g. a started monitor)."""
    vm.python("remembered = ['x']")
    assert vm.eval("remembered + ['y']") == ["x", "y"]
    assert "x" in vm.python("print(*remembered)")


def test_the_guest_runs_its_kernels_userspace_and_this_checkout(vm: Vm, kernel: Kernel) -> None:
    """The node boots the kernel of its parametrisation with that release's userspace (Debian
    12's root and the host's Python for 6.1; Debian 13's root and its Python 3.13 for 6.12;
    sid's root, which has no VERSION_ID, and its Python 3.14 for 7.2), and the agent imports
    modstage from this checkout, not from another worktree."""
    assert vm.run("uname -r").check().stdout.strip() == kernel.release
    python = vm.eval("__import__('sys').version_info[:2]")
    os_release = vm.run(". /etc/os-release; echo ${VERSION_ID:-none}").check().stdout.strip()
    if kernel.series == "6.12":
        assert (python, os_release) == ([3, 13], "13")
    elif kernel.series == "7.2":
        assert (python, os_release) == ([3, 14], "none")
    else:
        assert os_release == "12"
    service_file = vm.python("import service; print(service.__file__)").strip()
    assert service_file == str(REPO / "service/__init__.py")


def test_qmp_talks_to_qemu(vm: Vm) -> None:
    """QMP commands reach this boot's qemu."""
    assert vm.qmp("query-status")["status"] == "running"


def test_a_guest_that_ends_before_its_agent_is_booted_once_more_then_fails(
    tmp_path: Path, kernel: Kernel
) -> None:
    """A guest that ends by itself before its agent answers (here: no init, so the kernel
    panics) is booted exactly once more; when that one ends too, VmBootError says so."""
    from tests.vm.harness import timing

    vm = Vm(tmp_path / "state", name="no-init", kernel_args=["rdinit=/none"], kernel=kernel)
    retries = len(timing.RETRIES)
    with pytest.raises(VmBootError, match="did not boot") as info:
        vm.start()
    assert vm.boots == 2 and len(timing.RETRIES) == retries + 1
    assert info.value.guest_ended and not vm.running
    vm.close()


def test_a_boot_past_its_deadline_fails_and_leaves_no_qemu(tmp_path: Path, kernel: Kernel) -> None:
    """A guest that does not answer within boot_timeout raises VmBootError; qemu is killed."""
    vm = Vm(tmp_path / "state", name="too-slow", boot_timeout=1, kernel=kernel)
    began = time.monotonic()
    with pytest.raises(VmBootError, match="did not boot"):
        vm.start()
    assert time.monotonic() - began < 10
    assert not vm.running
    vm.close()


@pytest.fixture
def doomed(boot_vm: VmFactory) -> Iterator[Vm]:
    """A node of its own, for a test that panics it."""
    vm = boot_vm("panicking")
    yield vm
    vm.close()


def test_panicking_guest_raises_with_its_console_and_boots_again(
    doomed: Vm, signed_modules: dict[str, Path]
) -> None:
    """A module that panics in init ends qemu (panic=-1 + -no-reboot): the waiting call raises
    VmExited quoting the panic; start() then boots the same node again (a boot-loop step)."""
    module = doomed.put(signed_modules["ms_panic"], "kmod/ms_panic.ko")
    first = doomed.boot_id
    with pytest.raises(VmExited, match="Kernel panic"):
        doomed.eval(f"finit_module({module!r})")
    assert not doomed.running
    doomed.start()
    assert doomed.boot_id != first
    assert doomed.eval(f"os.path.exists({module!r})")

"""``modstage wait``: reading the status files the host really writes, on a scripted clock."""

from __future__ import annotations

import io
import shutil
from collections.abc import Callable
from pathlib import Path

import pytest

from service.bundles.phase import Phase
from service.bundles.state import BundleState, Generation
from service.cli import main
from service.layout import Layout
from service.publish.bundle_status import write_status
from stager.schema.paths import drop_name
from stager.schema.statusfile import StatusFile
from stager.wait import (
    EXIT_ACTIVE,
    EXIT_REFUSED,
    EXIT_TIMEOUT,
    Awaited,
    judge,
    wait_for,
)
from tests.stager.argv import module_bytes, stage_argv

KERNEL = "6.1.0-test"
GEN, OLD = "b" * 64, "a" * 64


def pending() -> BundleState:
    """GEN recorded as pending, OLD active."""
    b = BundleState().with_generation(Generation(OLD, "1", KERNEL, added=1.0))
    b = b.move(Phase.PENDING, pending=OLD).move(Phase.LOADING).move(Phase.ACTIVE, active=OLD)
    return b.with_generation(Generation(GEN, "2", KERNEL, added=2.0)).move(
        Phase.PENDING, pending=GEN
    )


def loading() -> BundleState:
    """GEN being loaded at boot."""
    return pending().move(Phase.LOADING)


def active() -> BundleState:
    """GEN came up."""
    return loading().move(Phase.ACTIVE, active=GEN, pending=None)


def failed() -> BundleState:
    """GEN failed at boot and OLD came back."""
    gen = Generation(GEN, "2", KERNEL, added=2.0, attempts=1, failed="ENOKEY: not signed")
    b = loading().with_generation(gen).move(Phase.FAILED, pending=None, note="ENOKEY")
    return b.move(Phase.LOADING).move(Phase.ACTIVE, active=OLD)


class Script:
    """A clock and a sleep that write the next status file each time the waiter sleeps."""

    def __init__(self, steps: list[Callable[[], object]]) -> None:
        self.now = 0.0
        self.steps = list(steps)
        self.sleeps: list[float] = []

    def clock(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.sleeps.append(seconds)
        self.now += seconds
        if self.steps:
            self.steps.pop(0)()


def run_script(
    layout: Layout, target: Awaited, steps: list[Callable[[], object]], timeout: float = 60
) -> tuple[int, list[str], Script]:
    """Wait on ``layout``'s nvidia status while ``steps`` play out; return code, lines, script."""
    script = Script(steps)
    seen: list[str] = []
    code = wait_for(
        lambda: StatusFile.read(layout.status / "nvidia.json"),
        target,
        seen.append,
        timeout=timeout,
        interval=2.0,
        clock=script.clock,
        sleep=script.sleep,
    )
    return code, seen, script


def test_waits_through_the_phases_until_active(tmp_path: Path) -> None:
    """No file, pending, loading, then active: exit 0 with one progress line per change."""
    layout = Layout(tmp_path)
    steps = [
        lambda: write_status(layout, "nvidia", pending()),
        lambda: write_status(layout, "nvidia", pending()),
        lambda: write_status(layout, "nvidia", loading(), generation=GEN),
        lambda: write_status(layout, "nvidia", active(), generation=GEN),
    ]
    code, seen, script = run_script(layout, Awaited(GEN), steps)
    assert code == EXIT_ACTIVE
    assert [s.split(" ")[0] for s in seen] == ["waiting", "pending", "loading", "generation"]
    assert script.sleeps == [2.0] * 4


def test_a_failed_generation_exits_1_with_the_kernels_reason(tmp_path: Path) -> None:
    """When GEN fails at boot and OLD comes back, wait reports GEN's failure, not OLD's success."""
    layout = Layout(tmp_path)
    write_status(layout, "nvidia", pending())
    steps = [lambda: write_status(layout, "nvidia", failed(), generation=OLD)]
    code, seen, _ = run_script(layout, Awaited(GEN), steps)
    assert code == EXIT_REFUSED and "ENOKEY: not signed" in seen[-1]


def test_a_rejection_of_our_drop_exits_1(tmp_path: Path) -> None:
    """A status file naming our drop as rejected ends the wait with the host's reasons."""
    layout = Layout(tmp_path)
    drop = tmp_path / drop_name("nvidia", 10**18, "ab")
    write_status(
        layout, "nvidia", pending(), phase=Phase.REJECTED, errors=["bad sig"], drop=drop.name
    )
    code, seen, _ = run_script(layout, Awaited.from_drop(drop), [])
    assert code == EXIT_REFUSED and seen == ["drop rejected: bad sig"]


def test_a_rejection_of_another_drop_is_not_ours() -> None:
    """A rejected drop with another name does not end the wait for ours."""
    doc = StatusFile("nvidia", "rejected", drop="nvidia.1.x", errors=("x",), updated=5.0)
    assert judge(doc, Awaited(GEN, "nvidia.2.y", 1.0)).code is None


def test_status_older_than_the_drop_is_ignored() -> None:
    """An active status written before our drop was staged is not our generation's success."""
    doc = StatusFile("nvidia", "active", generation=OLD, active=OLD, updated=5.0)
    assert judge(doc, Awaited(None, "d", since=6.0)).code is None
    assert judge(doc, Awaited(None, "d", since=4.0)).code == EXIT_ACTIVE


def test_timeout_exits_3_with_the_last_phase(tmp_path: Path) -> None:
    """A generation stuck pending past the timeout exits 3 saying where it stuck."""
    layout = Layout(tmp_path)
    write_status(layout, "nvidia", pending())
    code, seen, script = run_script(layout, Awaited(GEN), [], timeout=5)
    assert code == EXIT_TIMEOUT and "timed out after 5 s" in seen[-1] and "pending" in seen[-1]
    assert script.now == 5.0


def test_drop_manifest_gives_the_generation(tmp_path: Path) -> None:
    """While the drop still holds its manifest, its digest is the generation waited for."""
    from stager.schema.manifest import Manifest

    m = Manifest.from_dict(
        {
            "schema": 1,
            "bundle": "nvidia",
            "version": "2",
            "kernel": KERNEL,
            "after": [],
            "module": [{"file": "modules/n.ko", "sha256": "0" * 64, "params": ""}],
            "firmware": [],
        }
    )
    drop = tmp_path / drop_name("nvidia", 2 * 10**18, "cd")
    drop.mkdir()
    (drop / "manifest.toml").write_bytes(m.to_toml())
    assert Awaited.from_drop(drop) == Awaited(m.digest, drop.name, 2e9)


def test_cli_writes_the_ready_file_on_success(tmp_path: Path) -> None:
    """``modstage wait --ready-file`` creates the file once active and prints the progress."""
    layout = Layout(tmp_path)
    write_status(layout, "nvidia", active(), generation=GEN)
    ready = tmp_path / "validations/.driver-ctr-ready"
    out = io.StringIO()
    argv = ["wait", "--status-dir", str(layout.status), "--bundle", "nvidia"]
    code = main([*argv, "--generation", GEN, "--ready-file", str(ready)], out)
    assert code == 0 and ready.exists()
    assert out.getvalue() == f"nvidia: generation {GEN[:12]} is active\n"


def test_cli_times_out_without_a_status_file(tmp_path: Path) -> None:
    """With nothing written, the real clock times out and no ready file appears."""
    ready = tmp_path / "ready"
    argv = ["wait", "--status-dir", str(tmp_path), "--bundle", "nvidia", "--timeout", "0.05"]
    out = io.StringIO()
    assert main([*argv, "--interval", "0.01", "--ready-file", str(ready)], out) == EXIT_TIMEOUT
    assert not ready.exists() and "timed out" in out.getvalue()


def test_wait_runs_with_the_standard_library_and_tomli_w_alone(tmp_path: Path) -> None:
    """In a Python without site-packages (tomli-w only), wait runs and imports no host code."""
    import shutil
    import subprocess
    import sys

    import tomli_w

    ROOT = Path(__file__).resolve().parents[2]
    shutil.copytree(Path(tomli_w.__file__).parent, tmp_path / "lib" / "tomli_w")
    write_status(Layout(tmp_path), "nvidia", active(), generation=GEN)
    script = (
        "import sys; from service.cli import main; "
        f"rc = main(['wait', '--status-dir', {str(Layout(tmp_path).status)!r}, '--bundle', 'nvidia']); "
        "bad = sorted(m for m in sys.modules if m.split('.')[0] in "
        "('structlog', 'rich', 'prometheus_client', 'cryptography') or m == 'service.bundles.state'); "
        "print(rc, bad)"
    )
    # this test's own staged-notes directory: a note another process left in the shared tmp
    # directory would make ``wait --bundle`` wait for that drop
    env = {
        "PYTHONPATH": f"{ROOT}:{tmp_path / 'lib'}",
        "PATH": "/usr/bin:/bin",
        "MODSTAGE_STAGED_DIR": str(tmp_path / "staged-notes"),
    }
    result = subprocess.run(
        [sys.executable, "-S", "-c", script],
        env=env,
        capture_output=True,
        text=True,
        check=False,
        timeout=120,
    )
    assert result.stdout.splitlines()[-1] == "0 []", result.stderr


def test_wait_keeps_waiting_through_a_digest_only_upgrade(tmp_path: Path) -> None:
    """The digest-only upgrade (``status`` says upgrading): the init container unloaded OLD,
    the pod dropped OLD again, the host made it pending once more and asked the reboot.
    ``wait`` for OLD does not take the active record for done while OLD is pending again;
    it answers 0 once the boot loaded it."""
    layout = Layout(tmp_path)
    live = pending().move(Phase.LOADING).move(Phase.ACTIVE, active=OLD, pending=None)
    again = live.reloading(OLD)
    scheduled = again.move(Phase.REBOOT_SCHEDULED)
    steps = [
        lambda: write_status(layout, "nvidia", again, generation=OLD),
        lambda: write_status(layout, "nvidia", scheduled, generation=OLD),
        lambda: write_status(layout, "nvidia", scheduled, generation=OLD),
        lambda: write_status(
            layout,
            "nvidia",
            live.move(Phase.PENDING, pending=OLD)
            .move(Phase.LOADING)
            .move(Phase.ACTIVE, pending=None),
            generation=OLD,
        ),
    ]
    code, seen, _script = run_script(layout, Awaited(OLD), steps)
    assert code == EXIT_ACTIVE
    assert [s.split(" ")[0] for s in seen] == [
        "waiting",
        "pending",
        "reboot_scheduled",
        "generation",
    ]


def _stage_then_wait(layout: Layout, tmp_path: Path, *, taken_in: bool) -> tuple[int, str]:
    """The README's container: ``stage`` a drop into incoming, then ``wait --bundle`` alone,
    while the status file still names the previous generation (GEN) active."""
    write_status(layout, "nvidia", active(), generation=GEN)
    layout.incoming.mkdir(parents=True)
    module = tmp_path / "nvidia.ko"
    module.write_bytes(module_bytes())
    staged = io.StringIO()
    assert main(stage_argv(layout.incoming, "--module", str(module)), staged) == 0
    if taken_in:  # the host took the drop out of incoming but has not written its status yet
        shutil.rmtree(staged.getvalue().strip())
    out = io.StringIO()
    argv = ["wait", "--status-dir", str(layout.status), "--bundle", "nvidia"]
    return main([*argv, "--timeout", "0", "--interval", "0.01"], out), out.getvalue()


def test_wait_after_stage_waits_for_that_drop_not_the_previous_generation(
    tmp_path: Path,
) -> None:
    """``stage`` then ``wait --bundle`` (the README's first form) must not report the
    previous generation's success: it waits for the drop just staged, whether the drop is
    still in incoming or the host took it in already, and says which drop it waits for."""
    for taken_in in (False, True):
        root = tmp_path / str(taken_in)
        code, text = _stage_then_wait(Layout(root), root, taken_in=taken_in)
        assert code == EXIT_TIMEOUT, text
        assert "waiting for the last drop staged, nvidia." in text
        assert f"generation {GEN[:12]} is active" not in text


def test_wait_sees_a_drop_in_incoming_it_did_not_note(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A drop of the bundle still in the incoming directory beside the status directory
    (staged by another process of the pod) is waited for, too."""
    layout = Layout(tmp_path)
    monkeypatch.setenv("MODSTAGE_STAGED_DIR", str(tmp_path / "elsewhere"))
    write_status(layout, "nvidia", active(), generation=GEN)
    layout.incoming.mkdir(parents=True)
    module = tmp_path / "nvidia.ko"
    module.write_bytes(module_bytes())
    assert main(stage_argv(layout.incoming, "--module", str(module)), io.StringIO()) == 0
    monkeypatch.setenv("MODSTAGE_STAGED_DIR", str(tmp_path / "another-container"))
    out = io.StringIO()
    argv = ["wait", "--status-dir", str(layout.status), "--bundle", "nvidia", "--timeout", "0"]
    assert main(argv, out) == EXIT_TIMEOUT, out.getvalue()

"""``modstage status --reboot-required``, kured's sentinel command: its exit code in every state.

kured reads 0 as "reboot", 1 as a silent "no", anything else as "no" with a warning carrying
stderr. So every error must be 3 with the reason on stderr, never 1 and never a traceback.
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

import pytest

from service.bundles.phase import Phase
from service.bundles.records import RebootIntent
from service.bundles.state import BundleState, Generation, State
from service.bundles.statefile import save
from service.cli import main
from service.layout import Layout, kernel_image, modules_dir
from service.rebooting.gate import Gate, uncovered
from service.status.required import NOT_REQUIRED, REQUIRED, UNKNOWN, decide, run
from tests.hosts import running_host

KERNEL = "6.1.0-test"
BOOT = "boot-2"
OLD, NEW = "a" * 64, "b" * 64
REPO = Path(__file__).resolve().parents[2]


def active() -> BundleState:
    """A bundle whose generation OLD is active."""
    b = BundleState().with_generation(Generation(OLD, "1.0", KERNEL, added=1.0))
    b = b.move(Phase.PENDING, pending=OLD).move(Phase.LOADING)
    return b.move(Phase.ACTIVE, active=OLD, pending=None)


def pending() -> BundleState:
    """``active()`` with NEW pending for the running kernel."""
    b = active().with_generation(Generation(NEW, "2.0", KERNEL, added=2.0))
    return b.move(Phase.PENDING, pending=NEW)


def host(root: Path, state: State | None = None, config: str | None = None) -> Layout:
    """A temporary host: kernel release, boot id, and optionally a state and a config."""
    layout = running_host(root, KERNEL, BOOT)
    if state is not None:
        save(layout.state, state)
    if config is not None:
        layout.etc.mkdir(parents=True, exist_ok=True)
        layout.config.write_text(config)
    return layout


def ask(root: Path, capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    """Run the command through the CLI; (exit code, stdout, stderr)."""
    code = main(["status", "--root", str(root), "--reboot-required"], sys.stdout)
    got = capsys.readouterr()
    return code, got.out, got.err


KURED = '[reboot]\nbackend = "kured"\n'
INTENT = RebootIntent(1.0, BOOT, "kured", ("nvidia",))

NOT_ERRORS: list[tuple[str, Callable[[Path], object], int, str]] = [
    ("fresh host, no state", lambda r: host(r), NOT_REQUIRED, "no reboot required"),
    ("active only", lambda r: host(r, State({"nvidia": active()})), NOT_REQUIRED, "no reboot"),
    ("pending, backend none", lambda r: host(r, State({"nvidia": pending()})), REQUIRED, "nvidia"),
    (
        "pending for another kernel",
        lambda r: host(
            r,
            State(
                {
                    "nvidia": active()
                    .with_generation(Generation(NEW, "2.0", "6.12.0-other", added=2.0))
                    .move(Phase.PENDING, pending=NEW)
                }
            ),
        ),
        NOT_REQUIRED,
        "no reboot required",
    ),
    (
        "pending, backend kured, daemon has not asked yet",
        lambda r: host(r, State({"nvidia": pending()}), KURED),
        NOT_REQUIRED,
        "no reboot required",
    ),
    (
        "pending, backend kured, daemon asked in this boot",
        lambda r: host(r, State({"nvidia": pending()}, reboot=INTENT), KURED),
        REQUIRED,
        "nvidia",
    ),
    (
        "pending, backend kured, request from an earlier boot",
        lambda r: host(
            r, State({"nvidia": pending()}, reboot=replace(INTENT, boot_id="boot-1")), KURED
        ),
        NOT_REQUIRED,
        "no reboot required",
    ),
]


@pytest.mark.parametrize(
    ("case", "make", "code", "said"), NOT_ERRORS, ids=[c[0] for c in NOT_ERRORS]
)
def test_required_and_not_required(
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    case: str,
    make: Callable[[Path], object],
    code: int,
    said: str,
) -> None:
    """0 exactly when modstage wants the reboot, 1 otherwise, silently (nothing on stderr)."""
    make(tmp_path)
    got, out, err = ask(tmp_path, capsys)
    assert (got, err) == (code, ""), case
    assert out.startswith(said)


def test_the_hosts_own_reboot_required_file_is_honoured(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """/var/run/reboot-required (unattended-upgrades) alone makes the answer 0, and says so."""
    layout = host(tmp_path, State({"nvidia": active()}), KURED)
    layout.reboot_sentinel.parent.mkdir(parents=True)
    layout.reboot_sentinel.write_text("*** System restart required ***\n")
    code, out, _ = ask(tmp_path, capsys)
    assert code == REQUIRED and f"{layout.reboot_sentinel} exists" in out


ERRORS: list[tuple[str, Callable[[Path], object], str]] = [
    (
        "corrupt state",
        lambda r: host(r, State()).state.write_text("{not json"),
        "state.json could not be read (state file is corrupt",
    ),
    (
        "state.json is a directory",
        lambda r: host(r).state.mkdir(parents=True),
        "state.json could not be read (Is a directory",
    ),
    (
        "corrupt state set aside",
        lambda r: (
            host(r).var.mkdir(parents=True),
            (Layout(r).var / "state.json.corrupt-1").write_text("x"),
        ),
        "state.json.corrupt-1 could not be read (an earlier state file was corrupt",
    ),
    ("root is not a directory", lambda r: None, "not a directory"),
    (
        "root without /proc",
        lambda r: (r / "x").mkdir(),
        "osrelease could not be read (No such file",
    ),
    (
        "config is not TOML",
        lambda r: host(r, config="[reboot\n"),
        "config.toml could not be read (Expected",
    ),
    (
        "config is a directory",
        lambda r: host(r).config.mkdir(parents=True),
        "config.toml could not be read ([Errno 21] Is a directory",
    ),
    (
        "config has an unknown key",
        lambda r: host(r, config="rebooot = 1\n"),
        "rebooot: unknown key",
    ),
]


@pytest.mark.parametrize(("case", "make", "reason"), ERRORS, ids=[c[0] for c in ERRORS])
def test_every_error_is_exit_3_with_the_reason_on_stderr(
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    case: str,
    make: Callable[[Path], object],
    reason: str,
) -> None:
    """An error is never 1 (kured's silent no) and never a traceback: 3, reason on stderr."""
    root = tmp_path / "root"
    if case == "root is not a directory":
        root.write_text("")
    else:
        root.mkdir()
        make(root)
    code, out, err = ask(root, capsys)
    assert code == UNKNOWN, (case, out, err)
    assert reason in err and "cannot tell" in err and "Traceback" not in err


class Exploding(Layout):
    """A layout whose config path raises what no code expects (a bug's stand-in)."""

    @property
    def config(self) -> Path:
        raise RuntimeError("boom")


def test_an_unexpected_exception_is_exit_3_too(tmp_path: Path) -> None:
    """Even a bug inside the check gives 3 and one line on stderr, not exit 1."""
    import io

    host(tmp_path)
    out, err = io.StringIO(), io.StringIO()
    assert run(Exploding(tmp_path), out, err) == UNKNOWN
    assert "RuntimeError: boom" in err.getvalue() and out.getvalue() == ""


def test_a_real_process_prints_no_traceback(tmp_path: Path) -> None:
    """As kured runs it: a separate process on a wrong root exits 3 with one line on stderr."""
    argv = ["status", "--reboot-required", "--root", str(tmp_path / "nope")]
    done = subprocess.run(
        [sys.executable, "-m", "service.cli", *argv],
        capture_output=True,
        text=True,
        cwd=REPO,
        check=False,
    )
    assert done.returncode == UNKNOWN
    assert "Traceback" not in done.stderr and len(done.stderr.splitlines()) == 1


def test_decide_is_a_pure_function_of_its_inputs() -> None:
    """The decision table: backend none at once, other backends after the daemon asked."""
    state = State({"nvidia": pending()})
    kw = {"kernel": KERNEL, "boot_id": BOOT, "host_file": None}
    assert decide(state, backend="none", **kw).required  # type: ignore[arg-type]
    assert not decide(state, backend="kured", **kw).required  # type: ignore[arg-type]
    asked = replace(state, reboot=INTENT)
    assert decide(asked, backend="systemd", **kw).reasons == ("nvidia",)  # type: ignore[arg-type]
    both = decide(asked, backend="kured", kernel=KERNEL, boot_id=BOOT, host_file="/f")
    assert both.reasons == ("nvidia", "/f exists")


NEXT = "6.12.0-next"


def test_the_next_kernel_s_gate_holds_a_wanted_reboot_until_its_bound() -> None:
    """The next boot runs NEXT and ``nvidia`` (active on the running kernel) has nothing
    for it: the host's reboot-required file is held (not required, ``held``) while the bound
    is ahead, and goes through past it, saying nvidia boots without its driver. A bundle
    with a pending generation for NEXT is covered; one held by an admin is not (its pending
    generation would not load); a bundle with nothing active has nothing to lose."""
    state = State({"nvidia": active()})
    assert uncovered(state, NEXT) == {"nvidia": "none"} and uncovered(state, KERNEL) == {}
    gate = Gate(NEXT, ("nvidia",), since=100.0, until=200.0, now=150.0)
    kw = {"kernel": KERNEL, "boot_id": BOOT, "backend": "kured"}
    held = decide(state, host_file="/var/run/reboot-required", gate=gate, **kw)  # type: ignore[arg-type]
    assert (held.required, held.held, held.reasons) == (
        False,
        True,
        ("/var/run/reboot-required exists",),
    )
    assert held.gate is not None and held.gate.line().startswith(
        f"held: the next boot runs kernel {NEXT} and nvidia has no generation for it"
    )
    past = decide(state, host_file="/var/run/reboot-required", gate=replace(gate, now=200.0), **kw)  # type: ignore[arg-type]
    assert past.required and not past.held
    assert past.reasons[-1].startswith(f"the next boot runs kernel {NEXT} and nvidia has no")
    assert "boots without its driver" in past.reasons[-1]
    quiet = decide(state, host_file=None, gate=gate, **kw)  # type: ignore[arg-type]
    assert (quiet.required, quiet.held, quiet.gate) == (False, False, gate)  # said, not held
    covered = active().with_generation(Generation(NEW, "2.0", NEXT, added=2.0))
    covered = covered.move(Phase.PENDING, pending=NEW)
    assert uncovered(State({"nvidia": covered}), NEXT) == {}
    assert uncovered(State({"nvidia": replace(covered, held=True)}), NEXT) == {"nvidia": "held"}
    fresh = BundleState().with_generation(Generation(NEW, "2.0", KERNEL, added=2.0))
    assert uncovered(State({"new": fresh.move(Phase.PENDING, pending=NEW)}), NEXT) == {}


def test_a_held_reboot_exits_4_with_the_gate_s_words(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """``run`` prints the gate's line and the reboot it holds on stdout and exits 4 (kured
    logs a code other than 0 and 1 as a warning with the output, and does not reboot)."""
    from unittest import mock

    from service.status import required

    gate = Gate(NEXT, ("nvidia",), since=100.0, until=200.0, now=150.0)
    held = required.Answer(False, ("/var/run/reboot-required exists",), held=True, gate=gate)
    with mock.patch.object(required, "answer", return_value=held):
        code = run(Layout(tmp_path), sys.stdout, sys.stderr)
    out = capsys.readouterr().out
    assert code == 4 == required.HELD
    assert out.startswith("held: the next boot runs kernel 6.12.0-next")
    assert out.rstrip().endswith("; wanted: /var/run/reboot-required exists")


def updated(root: Path, state: State, hold_max: int | None = None) -> Layout:
    """A host whose kernel NEXT was just installed (its image and module tree, written
    now) and is the next boot's (``[kernel] next``), with the host's reboot-required file
    unattended-upgrades writes after installing it."""
    config = f'[kernel]\nnext = "{NEXT}"\n' + (
        f"hold_max = {hold_max}\n" if hold_max is not None else ""
    )
    layout = host(root, state, config)
    layout.boot.mkdir(parents=True, exist_ok=True)
    kernel_image(layout, NEXT).write_bytes(b"MZ")
    modules_dir(layout, NEXT).mkdir(parents=True)
    layout.reboot_sentinel.parent.mkdir(parents=True, exist_ok=True)
    layout.reboot_sentinel.write_text("*** System restart required ***\n")
    return layout


def test_a_kernel_update_waits_for_the_driver_of_the_next_kernel(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The host's reboot-required file after a kernel update, nvidia active on the running
    kernel and nothing for NEXT: ``status --reboot-required`` exits 4 and names the kernel,
    the bundle and when the hold ends (the default bound: three days after the image was
    written), and plain status shows the same; a generation for NEXT pending lifts the hold
    (exit 0); ``hold_max = 0`` never holds and says nvidia boots without its driver."""
    layout = updated(tmp_path / "held", State({"nvidia": active()}))
    code, out, _ = ask(layout.root, capsys)
    assert code == 4, out
    assert f"held: the next boot runs kernel {NEXT} and nvidia has no generation for it" in out
    assert out.rstrip().endswith(f"wanted: {layout.reboot_sentinel} exists")
    main(["status", "--root", str(layout.root)], sys.stdout)
    plain = capsys.readouterr().out
    assert f"reboot: held: the next boot runs kernel {NEXT} and nvidia has no generation" in plain
    covered = active().with_generation(Generation(NEW, "2.0", NEXT, added=2.0))
    ready = updated(tmp_path / "ready", State({"nvidia": covered.move(Phase.PENDING, pending=NEW)}))
    code, out, _ = ask(ready.root, capsys)
    assert (code, out.strip()) == (REQUIRED, f"{ready.reboot_sentinel} exists"), out
    never = updated(tmp_path / "never", State({"nvidia": active()}), hold_max=0)
    code, out, _ = ask(never.root, capsys)
    assert code == REQUIRED, out
    assert (
        f"the next boot runs kernel {NEXT} and nvidia has no generation for it: it boots without its driver"
        in out
    )


def test_the_hold_ends_hold_max_after_the_kernel_was_installed(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The bound counts from the image's change time (when dpkg unpacked it), not from its
    modification time (the package's build date, which dpkg keeps): an image written an
    hour ago under ``hold_max = 1800`` holds nothing; with its mtime set a year back and
    ``hold_max = 3600`` it still holds."""
    import os
    import time
    from unittest import mock

    layout = updated(tmp_path / "h", State({"nvidia": active()}), hold_max=1800)
    image = kernel_image(layout, NEXT)
    later = image.stat().st_ctime + 3600
    with mock.patch("time.time", return_value=later):
        code, out, _ = ask(layout.root, capsys)
    assert code == REQUIRED and "boots without its driver" in out, out
    layout.config.write_text(f'[kernel]\nnext = "{NEXT}"\nhold_max = 3600\n')
    os.utime(image, (time.time() - 365 * 86400,) * 2)
    code, out, _ = ask(layout.root, capsys)
    assert code == 4, out

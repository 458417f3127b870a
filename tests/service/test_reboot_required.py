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

from service.cli import main
from service.layout import Layout
from service.status.required import NOT_REQUIRED, REQUIRED, UNKNOWN, decide, run
from service.store.phase import Phase
from service.store.records import RebootIntent
from service.store.state import BundleState, Generation, State
from service.store.statefile import save

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
    layout = Layout(root)
    layout.boot_id.parent.mkdir(parents=True, exist_ok=True)
    layout.os_release.write_text(KERNEL + "\n")
    layout.boot_id.write_text(BOOT + "\n")
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

"""``--root`` other than ``/`` is a sandbox: files only under the root, no module loaded, no reboot.

The last test runs the real commands (``serve``, ``status``, ``boot --dry-run``, ``boot``)
in a private mount namespace whose host directories, ``/sys`` and ``/tmp`` included, are
write-catching overlays, and proves that nothing outside the roots was written.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import shlex
import shutil
import sys
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from service.bundles.phase import Phase
from service.bundles.statefile import load, read
from service.cli import main
from service.cmd.host import kernel_for
from service.config import RebootConfig
from service.host.modules import LinuxKernel
from service.host.recording import RecordingKernel
from service.host.running import RunningHost
from service.layout import Layout
from service.rebooting.request import CommandRebooter, KuredSentinel, rebooter
from stager.drop import ModuleSpec, stage
from tests.kmod import SigningKey, sign
from tests.mountns import SETUP_FAILED, Overlay, run
from tests.service.conftest import HostTree
from tests.service.fakes import make_host

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture
def host(host_tree: HostTree) -> Layout:
    """A sandbox host tree with one offline memory block (``memory1``)."""
    return host_tree({0: "online", 1: "offline"})


@pytest.fixture
def drop(host: Layout, modules: dict[str, Path], rsa_key: SigningKey, tmp_path: Path) -> Path:
    """A staged drop: two signed modules (one with parameters), firmware, a memory policy.
    Neither module declares the firmware: the host's config allows the bundle it."""
    host.config.parent.mkdir(parents=True, exist_ok=True)
    host.config.write_text(ALLOW_FIRMWARE)
    (tmp_path / "signed").mkdir()
    fw = tmp_path / "fw/modstage"
    fw.mkdir(parents=True)
    (fw / "test.bin").write_bytes(b"fw")
    signed = {n: sign(modules[n], rsa_key, tmp_path / "signed" / f"{n}.ko") for n in modules}
    return stage(
        host.incoming,
        bundle="nvidia",
        version="580.1",
        kernel=RunningHost.read(host).need_release(),
        modules=[
            ModuleSpec(signed["ms_exporter"], ""),
            ModuleSpec(signed["ms_params"], "count=7 label=hi"),
        ],
        firmware_dirs=(tmp_path / "fw",),
        memory="online_movable",
    )


def snapshot(root: Path) -> dict[str, tuple[int, str]]:
    """Every file under ``root``: mode and content digest (links: their target)."""
    seen: dict[str, tuple[int, str]] = {}
    for p in sorted(root.rglob("*")):
        st = p.lstat()
        body = os.readlink(p) if p.is_symlink() else ""
        if p.is_file() and not p.is_symlink():
            body = hashlib.sha256(p.read_bytes()).hexdigest()
        seen[str(p.relative_to(root))] = (st.st_mode, body)
    return seen


def test_a_sandbox_root_gets_a_recording_kernel() -> None:
    """``/`` (however spelled) is the machine; any other root never reaches finit_module."""
    assert isinstance(kernel_for(Layout(Path("/tmp/x"))), RecordingKernel)
    assert isinstance(kernel_for(Layout(Path("/tmp/.."))), LinuxKernel)
    assert not RunningHost.read(Layout()).sandboxed
    assert RunningHost.read(Layout(Path("relative"))).sandboxed


@pytest.mark.parametrize("backend", ["systemd", "command", "kexec"])
def test_machine_rebooting_backends_only_record_under_a_sandbox(host: Layout, backend: str) -> None:
    """systemctl reboot, a command, kexec: recorded under the root's run/, never run."""
    config = RebootConfig(backend=backend, command=("/sbin/reboot", "-f"))
    chosen = rebooter(config, host)
    assert isinstance(chosen, CommandRebooter)
    chosen.request("test")
    record = host.run / "reboot-commands"
    argvs = [json.loads(line) for line in record.read_text().splitlines()]
    expected = {
        "systemd": [["systemctl", "reboot"]],
        "command": [["/sbin/reboot", "-f"]],
        "kexec": [argvs[0], ["systemctl", "kexec"]],
    }[backend]
    assert argvs == expected and (backend != "kexec" or argvs[0][0] == "kexec")


def test_the_configured_kured_sentinel_lies_under_the_root(host: Layout) -> None:
    """``sentinel = "/run/modstage/reboot-required"`` means that path under ``--root``."""
    config = RebootConfig(backend="kured", sentinel=Path("/run/modstage/reboot-required"))
    chosen = rebooter(config, host)
    assert isinstance(chosen, KuredSentinel)
    assert chosen.path == host.root / "run/modstage/reboot-required"


def test_kured_backend_clears_only_its_own_sentinel(tmp_path: Path) -> None:
    """An unattended-upgrades sentinel at the same path is never overwritten nor removed."""
    path = tmp_path / "reboot-required"
    path.write_text("*** System restart required ***\n")
    KuredSentinel(path).request("x")  # the file asks for that reboot already: left as it is
    KuredSentinel(path).clear()
    assert path.read_text() == "*** System restart required ***\n"
    path.unlink()
    KuredSentinel(path).request("x")
    KuredSentinel(path).clear()
    assert not path.exists()


def _intake(host: Layout) -> None:
    assert main(["intake", "--root", str(host.root)], io.StringIO()) == 0
    assert load(host.state).bundle("nvidia").phase is Phase.PENDING


def preview_lines(text: str) -> list[str]:
    """The lines a dry run printed, each checked to start ``preview: ``, without it."""
    lines = text.splitlines()
    assert lines and all(line.startswith("preview: ") for line in lines), text
    return [line.removeprefix("preview: ") for line in lines]


def test_boot_dry_run_prints_the_boot_and_changes_nothing(host: Layout, drop: Path) -> None:
    """The dry run is the boot with every effect recorded: the memory policy and the
    firmware path it would write, the firmware it would link, each finit_module in order
    with its parameters, the phases the bundle would pass, the boot's own last line; every
    line says it is a preview; no file under the root changes."""
    _intake(host)
    before = snapshot(host.root)
    out = io.StringIO()
    assert main(["boot", "--root", str(host.root), "--dry-run"], out) == 0
    lines = preview_lines(out.getvalue())
    assert snapshot(host.root) == before
    assert lines[1].startswith("nvidia: would be loading (generation ") and "attempt 1" in lines[1]
    steps = [line.split(") ", 1)[1] for line in lines if line.startswith("   ")]
    assert steps == [
        "write devices/system/memory/auto_online_blocks = online_movable",
        "write devices/system/memory/memory1/state = online_movable",
        "link firmware firmware/modstage/test.bin",
        f"write module/firmware_class/parameters/path = {host.run}/firmware",
        "finit_module modules/ms_exporter.ko",
        "finit_module modules/ms_params.ko count=7 label=hi",
    ]
    assert lines[-2].startswith("nvidia: would be active (generation ")
    assert lines[-1].startswith("nvidia: active (active ")


def test_boot_dry_run_skips_what_is_loaded_and_names_another_version(
    host: Layout, drop: Path
) -> None:
    """The dry run makes the boot's own decisions: a module already loaded with the same
    srcversion is not loaded again, and another version already loaded fails the bundle
    (exit 1), as the boot would."""
    _intake(host)
    from service.verify.signature.trust import TrustStore
    from service.verify.verdict import verify_path

    store = next(host.store.iterdir())
    module = store / "modules/ms_params.ko"
    src = verify_path(
        module,
        trust=TrustStore.from_directory(host.trusted),
        kernel=RunningHost.read(host).need_release(),
    ).srcversion
    assert src
    live = host.sys / "module/ms_params"
    live.mkdir(parents=True)
    (live / "srcversion").write_text(f"{src}\n")
    (live / "initstate").write_text("live\n")
    out = io.StringIO()
    assert main(["boot", "--root", str(host.root), "--dry-run"], out) == 0
    finits = [line for line in preview_lines(out.getvalue()) if "finit_module" in line]
    assert [f.split()[2] for f in finits] == ["modules/ms_exporter.ko"], finits
    (live / "srcversion").write_text("0123456789ABCDEF\n")
    out = io.StringIO()
    assert main(["boot", "--root", str(host.root), "--dry-run"], out) == 1
    text = out.getvalue()
    assert "nvidia: would be failed (ms_params: another version is already loaded" in text


def test_boot_under_a_sandbox_root_records_the_loads(host: Layout, drop: Path) -> None:
    """The loader runs in full on the tree; the kernel calls are printed, not made."""
    _intake(host)
    out = io.StringIO()
    assert main(["boot", "--root", str(host.root)], out) == 0
    lines = [ln for ln in out.getvalue().splitlines() if "not called" in ln]
    assert [ln.split()[4] for ln in lines] == ["finit_module", "finit_module"]
    assert lines[0].endswith("ms_exporter.ko") and lines[1].endswith(
        "ms_params.ko count=7 label=hi"
    )
    assert read(host.state).bundle("nvidia").phase is Phase.ACTIVE
    memory = host.sys / "devices/system/memory"
    assert (memory / "auto_online_blocks").read_text() == "online_movable"


#: the drop's ``modstage/test.bin`` is declared by none of its modules
ALLOW_FIRMWARE = """\
[bundles.nvidia]
firmware = ["modstage/*"]
"""

CONFIG = (
    ALLOW_FIRMWARE
    + """\
[reboot]
backend = "{backend}"
{sentinel}
min_delay = 0
"""
)

WATCHED = ["/etc", "/var", "/run", "/usr", "/opt", "/boot", "/root", "/home", "/srv", "/sys"]


@dataclass(frozen=True)
class KeepOverlay(Overlay):
    """An overlay over ``target`` (``/tmp``) that catches every write except below ``keep``
    (the test's own directory, holding the roots), which stays the real directory: it is
    bind-mounted to ``hold`` (outside ``target``) before the overlay is mounted, and back
    over itself after. ``upper`` must lie outside ``target`` too (overlayfs refuses an
    upper layer inside its lower one)."""

    keep: Path = Path()
    hold: Path = Path()

    def mount(self) -> str:
        """Hold ``keep``, mount the overlay, put ``keep`` back (exit 97 if any step fails)."""
        self.hold.mkdir(parents=True, exist_ok=True)
        failed = f" || exit {SETUP_FAILED}"
        return "\n".join(
            [
                f"mount --bind {shlex.quote(str(self.keep))} {shlex.quote(str(self.hold))}{failed}",
                super().mount(),
                f"mount --bind {shlex.quote(str(self.hold))} {shlex.quote(str(self.keep))}{failed}",
            ]
        )


@pytest.fixture
def shm() -> Iterator[Path]:
    """A directory on /dev/shm (outside /tmp and every watched directory), removed after."""
    path = Path(tempfile.mkdtemp(prefix="modstage-sandbox-", dir="/dev/shm"))
    yield path
    shutil.rmtree(path)


def test_nothing_outside_the_root_changes(
    host: Layout, drop: Path, tmp_path: Path, kernel: str, rsa_key: SigningKey, shm: Path
) -> None:
    """serve (systemd and kured backends), status, boot --dry-run and boot, run for real in a
    mount namespace whose host directories, ``/sys`` and ``/tmp`` catch writes: every write
    lands under the roots (the test's own directory in ``/tmp`` gets only the two logs)."""
    host.etc.mkdir(parents=True, exist_ok=True)
    host.config.write_text(CONFIG.format(backend="systemd", sentinel=""))
    kured = make_host(tmp_path / "kured", kernel, rsa_key.cert_pem)
    kured.config.write_text(
        CONFIG.format(backend="kured", sentinel='sentinel = "/run/modstage/reboot-required"')
    )
    shutil.copytree(drop, kured.incoming / drop.name)  # the same drop for the second daemon
    cli = f"{sys.executable} -m service.cli"
    a, b = host.root, kured.root
    script = f"""
{cli} serve --root {a} > {tmp_path}/serve-a.log 2>&1 & A=$!
{cli} serve --root {b} > {tmp_path}/serve-b.log 2>&1 & B=$!
for i in $(seq 600); do
  [ -e {a}/run/modstage/reboot-commands ] && [ -e {b}/run/modstage/reboot-required ] && break
  sleep 0.1
done
kill -TERM $A $B; wait $A $B
{cli} status --root {a} --reboot-required; echo "required-rc=$?"
{cli} status --root {a} > /dev/null; echo "status-rc=$?"
{cli} boot --root {a} --dry-run
echo 00000000-0000-0000-0000-0000000000b2 > {a}/proc/sys/kernel/random/boot_id  # the reboot
{cli} boot --root {a}
"""
    tmp = KeepOverlay("/tmp", upper=shm / "tmp", keep=tmp_path, hold=shm / "hold")
    overlays = [tmp] + [Overlay(d, upper=tmp_path / "caught" / d.strip("/")) for d in WATCHED]
    roots = {"root", "kured", "caught"}  # the two roots and the overlays' upper layers
    own = {n: snapshot(tmp_path / n) for n in os.listdir(tmp_path) if n not in roots}
    env = {**os.environ, "PYTHONPATH": str(REPO), "PYTHONDONTWRITEBYTECODE": "1"}
    env.pop("NOTIFY_SOCKET", None)
    done = run(["sh", "-c", script], overlays, env=env, timeout=240)
    logs = (tmp_path / "serve-a.log").read_text() + (tmp_path / "serve-b.log").read_text()
    assert done.returncode == 0, done.stdout + done.stderr + logs
    caught = {d: o.written() for d, o in zip(["/tmp", *WATCHED], overlays, strict=True)}
    assert caught == {d: [] for d in ["/tmp", *WATCHED]}
    assert set(os.listdir(tmp_path)) - roots == {*own, "serve-a.log", "serve-b.log"}
    assert {n: snapshot(tmp_path / n) for n in own} == own
    assert json.loads((a / "run/modstage/reboot-commands").read_text()) == ["systemctl", "reboot"]
    assert (b / "run/modstage/reboot-required").read_text().startswith("modstage: ")
    assert "required-rc=0" in done.stdout, done.stdout
    assert ") finit_module modules/ms_params.ko count=7 label=hi\n" in done.stdout
    assert f"sandbox {a}: not called: finit_module" in done.stdout

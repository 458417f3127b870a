"""Sequences of drops, verbs and reboots on one host that once left status lying or a
record lost, each the shortest form of what the model (``test_model.py``) or a new user
found."""

from __future__ import annotations

import errno
import io
import json
import os
import shutil
import uuid
from pathlib import Path

from service.bundles.phase import Phase
from service.bundles.statefile import load
from service.cli import main
from service.layout import Layout
from service.status.collect import collect
from service.status.metrics import families
from stager.drop import ModuleSpec, stage
from tests.hosts import KEEP, running_host
from tests.kmod import SigningKey
from tests.service.fakes import FakeKernel, boot_with, make_host, make_intake, pending


def cli(*argv: str) -> tuple[int, str]:
    """``modstage ARGV`` in this process: (exit code, stdout)."""
    out = io.StringIO()
    return main(list(argv), out), out.getvalue()


def test_a_bundle_with_only_a_pending_generation_can_be_forgotten(
    host: Layout, signed: dict[str, Path], kernel: str
) -> None:
    """Nothing of a bundle never loaded is live: ``forget`` takes it, pending generation and
    all (and held, too); a bundle with an active generation is refused, saying so."""
    gen = pending(host, kernel, [(signed["ms_exporter"], "")], bundle="dmeo")
    assert cli("hold", "--root", str(host.root), "dmeo")[0] == 0
    code, out = cli("forget", "--root", str(host.root), "dmeo")
    assert code == 0, out
    assert "dmeo" not in load(host.state).bundles
    assert not (host.store / gen).exists() and not (host.status / "dmeo.json").exists()


def test_hold_reboot_release_asks_the_reboot_that_loads_the_pending_generation(
    host: Layout, signed: dict[str, Path], kernel: str
) -> None:
    """v1 active, v2 pending, held, a reboot brings v1 up (v2 passed over): after
    ``release`` the bundle is pending again, a reboot is required for it, ``wait`` does not
    call v2 active, and the next boot loads it."""
    root = ["--root", str(host.root)]
    pending(host, kernel, [(signed["ms_exporter"], "")], bundle="demo")
    assert cli("boot", *root)[0] == 0
    v2 = pending(host, kernel, [(signed["ms_params"], "")], version="2", bundle="demo")
    assert cli("hold", *root, "demo")[0] == 0
    reboot(host)
    assert cli("boot", *root)[0] == 0
    code, out = cli("release", *root, "demo")
    assert code == 0 and f"pending {v2[:12]} (loads at the next boot)" in out
    b = load(host.state).bundle("demo")
    assert (b.phase, b.pending) == (Phase.PENDING, v2)
    assert cli("status", *root, "--reboot-required")[0] == 0
    wait = ["wait", "--bundle", "demo", "--generation", v2, "--timeout", "0"]
    code, out = cli(*wait, "--status-dir", str(host.status))
    assert code == 3 and "active" not in out, out
    reboot(host)
    assert cli("boot", *root)[0] == 0
    assert load(host.state).bundle("demo").active == v2


def reboot(host: Layout) -> None:
    """A reboot of the sandbox: a new boot id, no module live, ``run/`` (kured's sentinel
    too) empty."""
    host.boot_id.write_text(f"{uuid.uuid4()}\n")
    for live in (host.sys / "module").iterdir():
        if live.name != "firmware_class":
            shutil.rmtree(live)
    for tmpfs in ("run", "var/run"):  # /run is a tmpfs (and /var/run a link to it)
        shutil.rmtree(host.root / tmpfs, ignore_errors=True)


def test_undoing_a_retry_records_the_failure_again(
    host: Layout, signed: dict[str, Path], kernel: str
) -> None:
    """v2 failed at boot; ``retry`` clears the failure, ``rollback B <active>`` undoes the
    retry: v2 is failed again with its reason, ``retry`` applies again, the host is not
    ``ok``."""
    v1 = pending(host, kernel, [(signed["ms_exporter"], "")], bundle="demo")
    boot_with(host, FakeKernel()).run()
    v2 = pending(host, kernel, [(signed["ms_params"], "")], version="2", bundle="demo")
    boot_with(host, FakeKernel(fail={"ms_params": errno.ENOKEY})).run()
    reason = load(host.state).bundle("demo").generations[v2].failed
    assert reason
    root = ["--root", str(host.root)]
    assert cli("retry", *root, "demo")[0] == 0
    code, out = cli("rollback", *root, "demo", v1[:12])
    assert code == 0 and "cancelled" in out, out
    b = load(host.state).bundle("demo")
    assert (b.pending, b.generations[v2].failed) == (None, reason)
    assert "still failed" in b.history[-1].note
    assert not cli("status", *root)[1].startswith("host: ok")
    assert cli("retry", *root, "demo")[0] == 0


def test_a_retry_that_cancels_a_rollback_says_so(
    host: Layout, signed: dict[str, Path], kernel: str
) -> None:
    """v2 active, a rollback to v1 pending; ``retry`` (of v2, the newest rolled back) cancels
    the rollback and says it did, not "retry recorded"."""
    root = ["--root", str(host.root)]
    v1 = pending(host, kernel, [(signed["ms_exporter"], "")], bundle="demo")
    boot_with(host, FakeKernel()).run()
    pending(host, kernel, [(signed["ms_params"], "")], version="2", bundle="demo")
    boot_with(host, FakeKernel()).run()
    assert cli("rollback", *root, "demo", v1[:12])[0] == 0
    code, out = cli("retry", *root, "demo")
    assert code == 0 and "pending rollback cancelled" in out, out
    assert load(host.state).bundle("demo").pending is None


def test_a_reboot_request_of_an_earlier_boot_is_not_shown_as_current(
    host: Layout, signed: dict[str, Path], kernel: str
) -> None:
    """With kured, the daemon asked a reboot for v1; the node rebooted without ``modstage
    boot`` and the daemon has not started since: ``--reboot-required`` says no (the request
    was of the earlier boot), and plain status and its JSON do not call it asked either."""
    host.config.write_text('[reboot]\nbackend = "kured"\n')
    pending(host, kernel, [(signed["ms_exporter"], "")], bundle="demo")
    ask_reboot(host)
    root = ["--root", str(host.root)]
    assert cli("status", *root, "--reboot-required")[0] == 0
    reboot(host)
    assert cli("status", *root, "--reboot-required")[0] == 1
    doc = json.loads(cli("status", *root, "--json")[1])
    assert doc["reboot"]["asked"] is None
    assert "asked via" not in doc["reboot"]["why_not_asked"]
    assert "asked via" not in cli("status", *root)[1].splitlines()[1]


def ask_reboot(host: Layout) -> None:
    """One daemon pass that asks for the reboot (no guard delay left)."""
    from service.cmd.host import Host
    from service.daemon.loop import Daemon

    h = Host(host)
    daemon = Daemon(host, h.config, h.intake, h.rebooter)
    daemon.maybe_reboot()
    assert load(host.state).reboot is not None


def test_hold_withdraws_the_reboot_kured_was_asked_for(
    host: Layout, signed: dict[str, Path], kernel: str
) -> None:
    """With kured, the daemon asked a reboot for ``demo``'s pending generation; ``hold``
    leaves nothing waiting: the sentinel modstage wrote is removed and the request cleared,
    so ``--reboot-required`` and status both say no reboot; ``release`` makes it wait again
    and the daemon asks anew. A sentinel another tool wrote is left alone."""
    host.config.write_text('[reboot]\nbackend = "kured"\n')
    pending(host, kernel, [(signed["ms_exporter"], "")], bundle="demo")
    ask_reboot(host)
    root = ["--root", str(host.root)]
    assert host.reboot_sentinel.exists()
    assert cli("hold", *root, "demo")[0] == 0
    assert not host.reboot_sentinel.exists() and load(host.state).reboot is None
    assert cli("status", *root, "--reboot-required")[0] == 1
    assert cli("release", *root, "demo")[0] == 0
    ask_reboot(host)
    assert host.reboot_sentinel.read_text().startswith("modstage: ")
    host.reboot_sentinel.write_text("*** System restart required ***\n")
    assert cli("hold", *root, "demo")[0] == 0
    assert host.reboot_sentinel.read_text() == "*** System restart required ***\n"


def as_nobody(root: Path, *argv: str) -> tuple[int, str, str]:
    """``modstage ARGV --root ROOT`` in a child that dropped root for nobody (65534), every
    module it needs imported first (the interpreter's own files may be root's alone):
    (exit code, stdout, stderr)."""
    import contextlib
    import tempfile

    import service.cmd.admin
    import service.cmd.status  # noqa: F401

    with tempfile.TemporaryFile("w+") as out, tempfile.TemporaryFile("w+") as err:
        pid = os.fork()
        if pid == 0:  # the child: never returns into pytest
            code = 99
            try:
                os.setgid(65534)
                os.setuid(65534)
                with contextlib.redirect_stderr(err):
                    code = main([argv[0], "--root", str(root), *argv[1:]], out)
            finally:
                out.flush()
                err.flush()
                os._exit(code)
        _, status = os.waitpid(pid, 0)
        out.seek(0)
        err.seek(0)
        return os.waitstatus_to_exitcode(status), out.read(), err.read()


def test_without_root_the_reading_commands_say_run_as_root(
    signed: dict[str, Path], kernel: str, rsa_key: SigningKey
) -> None:
    """``demo`` is active on a host whose state is root's alone; run as nobody, ``status``
    (plain and ``--json``) and ``generations`` exit 2 saying "run as root" (no grade, no
    "rejected", no advice to forget it); the verbs say so too instead of blaming --root;
    ``--reboot-required`` cannot tell (3), saying why."""
    import tempfile

    base = Path(tempfile.mkdtemp(prefix="modstage-nonroot-"))
    try:
        base.chmod(0o755)
        host = make_host(base / "root", kernel, rsa_key.cert_pem)
        root = ["--root", str(host.root)]
        pending(host, kernel, [(signed["ms_exporter"], "")], bundle="demo")
        assert cli("boot", *root)[0] == 0
        for argv in (["status"], ["status", "--json"], ["generations"], ["hold", "demo"]):
            code, out, err = as_nobody(host.root, *argv)
            assert code == 2 and out == "", (argv, out, err)
            assert "permission denied: run as root" in err, (argv, err)
            assert "forget" not in err and "--root" not in err, (argv, err)
        code, _, err = as_nobody(host.root, "status", "--reboot-required")
        assert code == 3 and "run as root" in err
    finally:
        shutil.rmtree(base)


def test_the_plain_view_says_its_history_is_the_last_five(
    host: Layout, signed: dict[str, Path], kernel: str
) -> None:
    """Past five entries the plain view says it shows the last 5 of N and where all are."""
    root = ["--root", str(host.root)]
    pending(host, kernel, [(signed["ms_exporter"], "")], bundle="demo")
    assert "history: the last" not in cli("status", *root)[1]
    for verb in ("hold", "release", "hold", "release", "hold"):
        assert cli(verb, *root, "demo")[0] == 0
    text = cli("status", *root)[1]
    assert "  history: the last 5 of 6 (all: modstage status --json | jq " in text, text


def test_the_boot_s_last_lines_name_the_generation_it_fell_back_from(
    host: Layout, signed: dict[str, Path], kernel: str
) -> None:
    """v2 fails at boot and v1 comes back: the boot's summary line for the bundle says it
    fell back from v2 and why, not only ``active``."""
    from service.boot.loader import summary

    pending(host, kernel, [(signed["ms_exporter"], "")], bundle="demo")
    boot_with(host, FakeKernel()).run()
    v2 = pending(host, kernel, [(signed["ms_params"], "")], version="2", bundle="demo")
    state = boot_with(host, FakeKernel(fail={"ms_params": errno.ENOKEY})).run()
    [line] = summary(state)
    assert line.startswith("demo: active (active ")
    assert f"; fell back from {v2[:12]} (2): modules/ms_params.ko: ENOKEY" in line, line


def test_a_drop_that_waits_is_not_shown_as_an_error(
    host: Layout, signed: dict[str, Path], kernel: str
) -> None:
    """A drop deferred while its bundle is held is shown as ``waits:``, not ``error:``, and
    the host stays ``ok``."""
    root = ["--root", str(host.root)]
    pending(host, kernel, [(signed["ms_exporter"], "")], bundle="demo")
    assert cli("boot", *root)[0] == 0
    assert cli("hold", *root, "demo")[0] == 0
    stage(
        host.incoming,
        bundle="demo",
        version="2",
        kernel=kernel,
        modules=[ModuleSpec(signed["ms_params"])],
    )
    assert cli("intake", *root)[0] == 0
    code, text = cli("status", *root)
    assert code == 0 and "  waits: bundle 'demo' is held by an admin" in text, text
    assert "error:" not in text


def test_a_quarantined_drop_s_advice_to_retry_says_when_the_generation_is_active_again(
    host: Layout, signed: dict[str, Path], kernel: str
) -> None:
    """v2 failed at boot; a drop of v2 again is refused ("already failed") and quarantined;
    after ``retry`` and a boot v2 is active: the quarantine line says so, rather than
    leaving its reason's advice standing."""
    root = ["--root", str(host.root)]
    pending(host, kernel, [(signed["ms_exporter"], "")], bundle="demo")
    boot_with(host, FakeKernel()).run()
    v2 = pending(host, kernel, [(signed["ms_params"], "")], version="2", bundle="demo")
    boot_with(host, FakeKernel(fail={"ms_params": errno.ENOKEY})).run()
    stage(
        host.incoming,
        bundle="demo",
        version="2",
        kernel=kernel,
        modules=[ModuleSpec(signed["ms_params"])],
    )
    assert cli("intake", *root)[0] == 1
    assert cli("retry", *root, "demo")[0] == 0
    boot_with(host, FakeKernel()).run()
    [line] = [ln for ln in cli("status", *root)[1].splitlines() if ln.startswith("quarantined")]
    assert line.endswith(f" (since then {v2[:12]} is active again: nothing to retry)"), line


def test_every_help_example_is_a_shell_command_one_can_paste() -> None:
    """Each command's ``--help`` example parses as shell (``bash -n``): a remark is a ``#``
    comment, never ``(…)`` after the command."""
    import subprocess

    from service.parser import EXAMPLE, VERBS

    for name, example in [("modstage", EXAMPLE), *((n, v.example) for n, v in VERBS.items())]:
        done = subprocess.run(["bash", "-n"], input=example, text=True, capture_output=True)
        assert done.returncode == 0, (name, example, done.stderr)


def test_a_stage_into_a_sandbox_does_not_replace_the_host_s_last_drop_note(
    host: Layout, signed: dict[str, Path], kernel: str, tmp_path: Path
) -> None:
    """``stage --into`` the host's incoming, then the same bundle into a sandbox's: ``wait``
    beside the host's status directory still finds the drop staged into the host's (the
    notes are per incoming directory), once the host took it in."""
    from stager.staged import last_drop, remember

    here = stage(
        host.incoming,
        bundle="demo",
        version="1",
        kernel=kernel,
        modules=[ModuleSpec(signed["ms_exporter"])],
    )
    remember(here, "a" * 64)
    (tmp_path / "sandbox/var/lib/modstage/incoming").mkdir(parents=True)
    there = stage(
        tmp_path / "sandbox/var/lib/modstage/incoming",
        bundle="demo",
        version="2",
        kernel=kernel,
        modules=[ModuleSpec(signed["ms_exporter"])],
    )
    remember(there, "b" * 64)
    assert make_intake(host).run()[0].accepted  # here left incoming: only the note knows it
    seen = last_drop("demo", host.status)
    assert seen is not None and seen.drop.name == here.name and seen.generation == "a" * 64


def test_the_boot_s_summary_says_when_nothing_is_for_the_running_kernel(
    host: Layout, signed: dict[str, Path], kernel: str
) -> None:
    """Given the running kernel, the summary line of a bundle whose generations are all for
    another kernel says so."""
    from service.boot.loader import summary

    pending(host, kernel, [(signed["ms_exporter"], "")], bundle="demo")
    state = boot_with(host, FakeKernel()).run()
    [line] = summary(state, "6.99.0-other")
    assert line.endswith(f"; nothing for this kernel 6.99.0-other (built for {kernel})"), line
    assert summary(state, kernel) == summary(state)


def test_a_reboot_into_a_kernel_without_a_generation_is_a_missing_driver_everywhere(
    host: Layout, signed: dict[str, Path], kernel: str
) -> None:
    """v1 active on the modules' kernel; the node reboots into another kernel (a kernel
    update) with no drop for it: ``boot`` loads nothing, says so, records ``other_kernel``
    and exits 1; the status file is rewritten in this boot, ``status`` grades the host
    failed naming the running kernel, ``wait`` does not exit 0 and the phase metric says
    ``other_kernel``. A reboot back into the modules' kernel loads v1 again, healthy."""
    root = ["--root", str(host.root)]
    v1 = pending(host, kernel, [(signed["ms_exporter"], "")], bundle="demo")
    assert cli("boot", *root)[0] == 0
    reboot(host)
    running_host(host, "6.99.0-other", KEEP)
    code, out = cli("boot", *root)
    assert code == 1, out
    assert f"demo: other_kernel (active {v1}, pending -)" in out
    assert "nothing for this kernel 6.99.0-other" in out
    b = load(host.state).bundle("demo")
    assert (b.phase, b.active, b.loaded) == (Phase.OTHER_KERNEL, v1, ())
    doc = json.loads((host.status / "demo.json").read_text())
    assert doc["phase"] == "other_kernel" and doc["boot_id"] == host.boot_id.read_text().strip()
    assert "no generation for the running kernel 6.99.0-other" in doc["errors"][0]
    code, out = cli("status", *root)
    assert code == 2 and out.startswith("host: FAILED"), out
    assert "no generation for the running kernel 6.99.0-other" in out
    code, out = cli("wait", "--status-dir", str(host.status), "--bundle", "demo", "--timeout", "0")
    assert code == 4 and "targets another kernel than the running 6.99.0-other" in out, out
    code, out = cli("boot", *root)  # the same boot: nothing done, nothing else said
    assert code == 0
    samples = {f.name: f.samples for f in families(collect(host))}["modstage_bundle_phase"]
    assert [labels["phase"] for labels, value in samples if value == 1.0] == ["other_kernel"]
    reboot(host)
    running_host(host, kernel, KEEP)
    code, out = cli("boot", *root)
    assert code == 0 and f"demo: active (active {v1}, pending -)" in out, out
    assert cli("status", *root)[0] == 0


def test_a_pending_generation_a_driver_less_boot_passed_over_still_has_its_reboot(
    host: Layout, signed: dict[str, Path], kernel: str
) -> None:
    """v1 active, v2 pending, both for the modules' kernel; a boot into another kernel
    records ``other_kernel`` and keeps v2 pending; back on the modules' kernel (its boot
    not run yet) a reboot is required for v2, and ``hold`` then ``release`` changes nothing
    but history (release does not take a pending generation for passed over by a hold)."""
    root = ["--root", str(host.root)]
    pending(host, kernel, [(signed["ms_exporter"], "")], bundle="demo")
    assert cli("boot", *root)[0] == 0
    v2 = pending(host, kernel, [(signed["ms_params"], "")], version="2", bundle="demo")
    reboot(host)
    running_host(host, "6.99.0-other", KEEP)
    assert cli("boot", *root)[0] == 1
    assert cli("status", *root, "--reboot-required")[0] == 1  # v2 cannot load on this kernel
    reboot(host)
    running_host(host, kernel, KEEP)
    b = load(host.state).bundle("demo")
    assert (b.phase, b.pending) == (Phase.OTHER_KERNEL, v2)
    code, out = cli("status", *root, "--reboot-required")
    assert code == 0 and "demo" in out, out
    before = load(host.state).bundle("demo")
    assert cli("hold", *root, "demo")[0] == 0 and cli("release", *root, "demo")[0] == 0
    after = load(host.state).bundle("demo")
    assert (after.phase, after.pending, after.active) == (before.phase, v2, before.active)

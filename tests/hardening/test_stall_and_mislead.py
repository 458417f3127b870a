"""Hostile drops: nothing a container writes may stop, stall or mislead the host.

Each test reproduces one finding of an attack with write access to ``incoming/`` alone,
then checks the general defence: contained per-drop steps, bounded validation and output,
admin commands within their contract (removal and the quarantine:
tests/hardening/test_quarantine_and_removal.py).
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

import pytest
import tomli_w
from structlog.testing import capture_logs

from service.bundles.records import RebootIntent
from service.bundles.statefile import load, save
from service.cli import main
from service.config import Config, Limits
from service.daemon.loop import Daemon
from service.daemon.notify import notify
from service.daemon.watcher import DropWatcher
from service.layout import Layout
from service.publish import quarantine
from service.publish.operator import bundle_status_files
from service.rebooting.request import NoRebooter
from service.verify.signature.trust import TrustStore
from stager.schema.failures import ManifestError
from stager.schema.manifest import MAX_MANIFEST_BYTES, Manifest
from stager.schema.paths import MANIFEST_NAME
from tests.hardening.conftest import make_intake, stage_drop
from tests.kmod import SigningKey
from tests.service.fakes import make_host

M = "ms_exporter"


def _good(host: Layout, kernel: str, signed: dict[str, Path], bundle: str = "good") -> Path:
    return stage_drop(host, kernel, [signed[M]], bundle=bundle)


def test_after_list_at_its_limit_is_accepted() -> None:
    """256 ``after`` names (the limit) are valid (what they cost: the next test)."""
    text = tomli_w.dumps(
        {"schema": 1, "bundle": "a", "version": "1", "kernel": "k", "after": _names(256)}
    )
    manifest = Manifest.from_toml(text + _MODULE)
    assert len(manifest.after) == 256


_MODULE = '[[module]]\nfile = "modules/a.ko"\nsha256 = "' + "0" * 64 + '"\n'


def _names(n: int) -> list[str]:
    return [f"b{i}" for i in range(n)]


def test_after_list_over_limit() -> None:
    """Over 256 ``after`` names: one problem, in well under a second of CPU time (was
    quadratic); CPU time, which the machine's other load barely moves, not wall time."""
    text = tomli_w.dumps(
        {"schema": 1, "bundle": "a", "version": "1", "kernel": "k", "after": _names(40_000)}
    )
    text += _MODULE
    started = time.process_time()
    with pytest.raises(ManifestError) as err:
        Manifest.from_toml(text)
    assert time.process_time() - started < 2.0
    assert err.value.problems == ("after: 40000 entries, more than 256",)


def test_canonical_size_checked_at_intake() -> None:
    """Found 4: a manifest under 1 MiB whose canonical form is over it passed intake.

    Boot reads the canonical form back and refused it; now parsing refuses it first.
    """
    entries = ",".join(
        f'{{file="firmware/{i:05d}{"y" * 150}",sha256="{"0" * 64}"}}' for i in range(4096)
    )
    raw = (
        'schema=1\nbundle="a"\nversion="1"\nkernel="k"\n'
        f'module=[{{file="modules/a.ko",sha256="{"0" * 64}"}}]\nfirmware=[{entries}]\n'
    ).encode()
    assert len(raw) <= MAX_MANIFEST_BYTES
    with pytest.raises(ManifestError, match=r"canonical form is .* bytes, over 1048576"):
        Manifest.from_toml(raw)


def test_intake_cli_refuses_paths_outside_its_contract(
    host: Layout, kernel: str, signed: dict[str, Path], tmp_path: Path
) -> None:
    """Found 3: ``intake R/var/lib/modstage`` deleted state and store; a plain file was unlinked."""
    queued = _good(host, kernel, signed, bundle="queued")
    make_intake(host).run()
    queued = _good(host, kernel, signed, bundle="queued2")
    state = host.state.read_bytes()
    plain = tmp_path / "notes.txt"
    plain.write_text("mine")
    for path in (host.var, plain, host.store, host.incoming, tmp_path / f"x/{queued.name}"):
        out = io.StringIO()
        assert main(["intake", "--root", str(host.root), str(path)], out) == 2, (
            path
        )  # refused as a usage error (exit 2)
    assert host.state.read_bytes() == state and plain.read_text() == "mine"
    assert queued.is_dir() and any(host.store.iterdir())


def test_intake_racing_another_writes_no_false_rejection(
    host: Layout, kernel: str, signed: dict[str, Path]
) -> None:
    """Found 5: an intake of a drop another intake just took wrote "rejected … does not exist"."""
    drop = _good(host, kernel, signed)
    [first] = make_intake(host).run()
    assert first.accepted
    status = (host.status / "good.json").read_bytes()
    [second] = make_intake(host).run([drop])  # the CLI's list, made before the lock was free
    assert second.gone and not second.deferred
    assert (host.status / "good.json").read_bytes() == status
    out = io.StringIO()
    assert main(["intake", "--root", str(host.root), str(drop)], out) == 0
    assert "gone" in out.getvalue()


def test_half_deleted_generation_is_cleaned_and_restaged(
    host: Layout, kernel: str, signed: dict[str, Path]
) -> None:
    """Found 7: a collection killed midway left store/<id>/ without a manifest; forever deferred."""
    drop = _good(host, kernel, signed)
    digest = Manifest.from_toml((drop / MANIFEST_NAME).read_bytes()).digest
    half = host.store / digest / "modules"
    half.mkdir(parents=True)
    (half / "left.ko").write_bytes(b"x")
    os.chmod(host.store / digest, 0o700)
    stray = host.store / ("f" * 64)
    (stray / "modules").mkdir(parents=True)
    [outcome] = make_intake(host).run()
    assert outcome.accepted, outcome.reasons
    assert (host.store / digest / MANIFEST_NAME).is_file()
    assert not stray.exists()


CONTROL = "\x1b[2J\x1b[H\nhost: ok\r"


def test_escape_sequences_never_reach_output(
    host: Layout, kernel: str, signed: dict[str, Path]
) -> None:
    """Found 8: an unknown key holding escapes and newlines drew fake lines in intake output."""
    drop = _good(host, kernel, signed)
    data = (drop / MANIFEST_NAME).read_text()
    (drop / MANIFEST_NAME).unlink()
    (drop / MANIFEST_NAME).write_text(data + f"{json.dumps(CONTROL)} = 1\n")
    out = io.StringIO()
    assert main(["intake", "--root", str(host.root)], out) == 1
    text = out.getvalue()
    assert text.count("\n") == 1 and "\x1b" not in text and "\r" not in text, text
    doc = json.loads((host.status / "good.json").read_text())
    assert not any(c in "".join(doc["errors"]) for c in "\x1b\n\r")


def test_output_is_bounded_for_a_megabyte_of_unknown_keys(
    host: Layout, kernel: str, signed: dict[str, Path]
) -> None:
    """Found 9: a 1 MiB manifest became a 48.9 MB status file and log line."""
    drop = _good(host, kernel, signed)
    data = (drop / MANIFEST_NAME).read_text()
    junk = "".join(f"k{i:06d} = 1\n" for i in range((MAX_MANIFEST_BYTES - len(data)) // 12 - 10))
    (drop / MANIFEST_NAME).unlink()
    (drop / MANIFEST_NAME).write_text(data + junk)
    with capture_logs() as logs:
        [outcome] = make_intake(host).run()
    assert not outcome.accepted
    assert (host.status / "good.json").stat().st_size < 32 << 10
    assert len(json.dumps(logs, default=str)) < 64 << 10
    assert len(outcome.reasons) <= 21


def test_disallowed_names_leave_no_per_name_state(
    host: Layout, kernel: str, signed: dict[str, Path]
) -> None:
    """Found 10: 2,000 disallowed bundles left 2,000 status files (and metric series)."""
    config = Config(allowed_bundles=("nvidia",))
    for i in range(60):
        _good(host, kernel, signed, bundle=f"junk{i}")
    outcomes = make_intake(host, config).run()
    assert len(outcomes) == 60 and not any(o.accepted for o in outcomes)
    # (the host's own _host.json is no per-name state)
    assert not host.status.exists() or list(bundle_status_files(host.status)) == []
    assert len(quarantine.records(host)) == Limits().quarantine_drops


def test_new_rejected_names_bounded_without_allowed_list(
    host: Layout, kernel: str, signed: dict[str, Path]
) -> None:
    """Without ``allowed_bundles``, rejections of unknown names create at most 64 status files."""
    for i in range(80):
        drop = _good(host, kernel, signed, bundle=f"junk{i}")
        (drop / "modules" / f"{M}.ko").write_bytes(b"swapped")
    outcomes = make_intake(host).run()
    assert len(outcomes) == 80 and not any(o.accepted for o in outcomes)
    assert len(bundle_status_files(host.status)) == 64


def test_state_untouched_by_the_stalling_drops(
    host: Layout, kernel: str, signed: dict[str, Path]
) -> None:
    """A rejected drop leaves state.json as it was (the quarantine is not state): the second
    intake did take the drop in, refuse it and remove it. (The second drop is a new version:
    the same manifest again would be the generation already in the store, taken as it is.)"""
    _good(host, kernel, signed)
    [first] = make_intake(host).run()
    assert first.accepted, first.reasons
    before = load(host.state)
    drop = stage_drop(host, kernel, [signed[M]], bundle="good", version="2")
    (drop / "modules" / f"{M}.ko").write_bytes(b"swapped")
    [second] = make_intake(host).run()
    assert not second.accepted and not second.deferred and second.reasons
    assert not os.path.lexists(drop)
    assert load(host.state) == before


def test_messy_trusted_directory_is_skipped_with_reasons(
    host: Layout, kernel: str, signed: dict[str, Path], rsa_key: SigningKey
) -> None:
    """Found 11: an empty .pem, a private key, a duplicate certificate stopped serve and boot."""
    (host.trusted / "empty.pem").write_bytes(b"")
    (host.trusted / "key.pem").write_bytes(rsa_key.key.read_bytes())
    (host.trusted / "again.pem").write_bytes(rsa_key.cert_pem.read_bytes())
    with capture_logs() as logs:
        trust = TrustStore.from_directory(host.trusted)
    assert [k.subject for k in trust.keys] == ["modstage rsa"]
    skipped = sorted(Path(e["path"]).name for e in logs if e["event"] == "trust.skipped")
    assert len(skipped) == 3, logs
    drop = _good(host, kernel, signed)
    [outcome] = make_intake(host).run()
    assert outcome.accepted and not drop.exists()


def _fill(directory: Path) -> None:
    """Fill the file system holding ``directory`` to the last block."""
    with (directory / "filler").open("wb") as f, contextlib.suppress(OSError):
        while True:
            f.write(b"\0" * (1 << 20))
            f.flush()
    with contextlib.suppress(OSError):
        for i in range(10_000):
            (directory / f"small{i}").write_bytes(b"x" * 512)


def test_full_disk_rejection_and_restart_are_not_fatal(
    tmp_path: Path,
    tmpfs: Callable[[Path, str], Path],
    kernel: str,
    rsa_key: SigningKey,
    signed: dict[str, Path],
) -> None:
    """Found 6: ENOSPC writing status in the rejection handler killed the daemon, and again
    at every start; reconcile's save crashed it after a reboot; ``intake`` printed a traceback.
    """
    root = tmp_path / "root"
    tmpfs(root / "var/lib/modstage", "4m")
    host = make_host(root, kernel, rsa_key.cert_pem)
    _good(host, kernel, signed, bundle="other")
    assert make_intake(host).run()[0].accepted
    bad = _good(host, kernel, signed, bundle="other")  # its module: not another bundle's
    (bad / "modules" / f"{M}.ko").write_bytes(b"swapped")
    state = load(host.state)
    save(host.state, replace(state, reboot=RebootIntent(1.0, "earlier boot")))
    _fill(host.var)
    with capture_logs() as logs:
        outcomes = make_intake(host).run()
    assert [o.accepted for o in outcomes] == [False]
    assert any(e["event"] in ("status.unwritable", "quarantine.unwritable") for e in logs) or (
        outcomes[0].deferred
    )
    daemon = Daemon(host, Config(), make_intake(host), NoRebooter())
    with capture_logs() as logs:
        daemon._guarded(daemon.reconcile)  # what serve() does at start
    assert any(e["event"] == "daemon.step_failed" for e in logs), logs
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stderr(err):
        code = main(["intake", "--root", str(root)], out)
    assert code == 1 and "Traceback" not in err.getvalue()


def test_state_json_directory_does_not_stop_serve(host: Layout) -> None:
    """Found 13: ``state.json`` as a directory killed ``serve`` at start with a traceback."""
    host.state.mkdir(parents=True)
    daemon = Daemon(host, Config(), make_intake(host), NoRebooter())
    with capture_logs() as logs:
        daemon._guarded(daemon.reconcile)
        daemon._guarded(daemon.take_drops)
        daemon._guarded(daemon.maybe_reboot)
    failed = [e for e in logs if e["event"] == "daemon.step_failed"]
    assert failed and all("state.json" in e["error"] for e in failed), logs
    [aside] = host.var.glob("state.json.corrupt-*")
    assert aside.is_dir()


def test_junk_drop_directories_spend_no_watch_and_are_polled(host: Layout) -> None:
    """Found 12: 300 junk directories spent the watches on drops; a real drop waited 300 s.

    Only the incoming directory is watched, so junk spends no watch; every drop directory
    that waits for its manifest is counted, and the daemon polls while there are any (here:
    the count and the interval; that the loop really polls, and only then, is shown on the
    fake clock by
    tests/service/test_daemon.py::test_a_drop_waiting_for_its_manifest_is_taken_in_by_polling).
    """
    for i in range(300):
        (host.incoming / f"junk.{i:020d}.{i:016x}").mkdir()
    daemon = Daemon(host, Config(), make_intake(host), NoRebooter())
    daemon.watcher = DropWatcher([host.incoming], daemon.events)
    try:
        daemon.take_drops()
    finally:
        daemon.watcher.stop()
    assert daemon.incomplete == 300
    assert daemon.poll_incomplete <= 1.0


def test_notify_never_blocks_on_a_slow_reader(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A notify socket nobody reads (its queue full) must not stall the daemon's loop."""
    path = tmp_path / "n.sock"
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sock:
        sock.bind(str(path))
        monkeypatch.setenv("NOTIFY_SOCKET", str(path))
        started = time.monotonic()
        sent = [notify("WATCHDOG=1") for _ in range(2000)]
        assert time.monotonic() - started < 5.0
        assert not all(sent)  # the queue filled up: later messages were dropped, not waited on


def test_wall_time_per_drop_is_bounded(host: Layout, kernel: str, signed: dict[str, Path]) -> None:
    """A drop that takes longer than ``limits.max_seconds`` is rejected saying so (the limit is
    checked before each file and before verification), and the next drop is taken in."""
    _good(host, kernel, signed, bundle="slow")
    intake = make_intake(host, Config(limits=Limits(max_seconds=1)))
    intake.tick = lambda: time.sleep(0.4)
    [outcome] = intake.run()
    assert not outcome.accepted and not outcome.deferred
    assert "took over 1 s" in outcome.reasons[0]
    _good(host, kernel, signed)
    assert make_intake(host).run()[0].accepted


def test_long_step_feeds_the_watchdog_only_while_it_progresses(
    host: Layout, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Found 2: 48.6 s without ``WATCHDOG=1`` while validating. A long step is now covered by
    a feeder, but only up to ``limits.max_seconds`` after its last progress."""
    path = tmp_path / "n.sock"
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sock:
        sock.bind(str(path))
        sock.settimeout(0.01)
        monkeypatch.setenv("NOTIFY_SOCKET", str(path))
        monkeypatch.setenv("WATCHDOG_USEC", "400000")  # pings every 0.1 s
        monkeypatch.delenv("WATCHDOG_PID", raising=False)
        daemon = Daemon(host, Config(limits=Limits(max_seconds=1)), make_intake(host), NoRebooter())
        started = time.monotonic()
        seen: list[float] = []
        done = threading.Event()

        def read() -> None:
            while not done.is_set():
                with contextlib.suppress(TimeoutError):
                    if sock.recv(64) == b"WATCHDOG=1":
                        seen.append(time.monotonic() - started)

        reader = threading.Thread(target=read)
        reader.start()
        with daemon.watchdog.feeding(daemon.config.limits.max_seconds):
            time.sleep(4.0)  # progresses for 1 s (max_seconds), then looks stuck
        done.set()
        reader.join()
    assert len(seen) >= 4, seen
    # nothing once the step was stuck past max_seconds: the last ping came at about 1 s,
    # 1.5 s of slack for a reader thread delayed on a loaded machine, 1.5 s to the end
    assert max(seen) < 2.5, seen

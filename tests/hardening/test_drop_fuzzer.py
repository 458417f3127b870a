"""A seeded drop fuzzer against a running ``modstage serve --root``.

Each round plants ``MODSTAGE_FUZZ_PER_ROUND`` hostile drops (tests/hardening/fuzz_drops.py)
and stages one good drop of another bundle, then checks: the daemon is alive and has fed
its watchdog within the unit's ``WatchdogSec`` (``NOTIFY_SOCKET`` is a socket of this
test), the good drop became pending (within 30 s: only a stuck daemon misses that; what an
attack costs a good drop is measured by ``bench/attacked``, not here, since a test's wall
time on a shared machine says nothing), nothing outside the drop was opened (inotify on
the canaries and on every FIFO, device node and socket planted), nothing was written
outside the places the daemon may write (every other path of the test's tree, the host
root and the canaries included, keeps its inode, mode, size and mtime; the default paths
of a real host stay absent), and status, metrics and log stay bounded.
``MODSTAGE_FUZZ_CASES`` (default 500, the unit suite's share; docs/reliability.md quotes 1000
and the long run) and ``MODSTAGE_FUZZ_SEED`` choose the run.
"""

from __future__ import annotations

import contextlib
import hashlib
import itertools
import json
import os
import random
import signal
import socket
import stat
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path

import pytest

from service.config import Limits
from service.intake.rejection import MAX_STATUS_FILES
from service.layout import Layout
from service.publish import quarantine
from stager.drop import ModuleSpec, stage
from stager.schema.manifest import Manifest
from stager.schema.paths import MANIFEST_NAME
from tests.hardening.fuzz_bombs import BOMBS
from tests.hardening.fuzz_drops import GENERATORS, World, clear_non_drops, drops_left, pending
from tests.hardening.invariants import published_problems, state_of
from tests.hardening.watch import AccessWatch

CASES = int(os.environ.get("MODSTAGE_FUZZ_CASES", "500"))
SEED = int(os.environ.get("MODSTAGE_FUZZ_SEED", "17"))
PER_ROUND = int(os.environ.get("MODSTAGE_FUZZ_PER_ROUND", "6"))
GOOD_WITHIN = 30.0  # s: a bound for a stuck daemon, not a latency figure (bench/attacked)
WATCHDOG_USEC = 30_000_000  # deploy/systemd/modstage.service: WatchdogSec=30s
MAX_STATUS_BYTES = 64 << 10
MAX_LOG_LINE = 64 << 10
MAX_LOG_PER_CASE = 64 << 10
ROOT_PATHS = [Path("/var/lib/modstage"), Path("/var/run/reboot-required"), Path("/run/modstage")]


@dataclass
class Notifications:
    """What the daemon sent to its NOTIFY_SOCKET, with the monotonic time it arrived."""

    sock: socket.socket
    seen: list[tuple[float, str]] = field(default_factory=list)

    def read_until(self, stop: threading.Event) -> None:
        """Receive what the daemon sends, as systemd would, until ``stop``."""
        self.sock.settimeout(0.05)
        while not stop.is_set():
            try:
                data = self.sock.recv(4096)
            except TimeoutError:
                continue
            except OSError:
                return
            self.seen.append((time.time(), data.decode(errors="replace")))

    def pump(self) -> None:
        """Nothing to do: a thread reads continuously (kept for the callers)."""

    def widest_gap(self, line: str) -> float:
        """The longest time between two ``line`` messages, or since the last one."""
        self.pump()
        times = [t for t, m in self.seen if line in m.split("\n")] + [time.time()]
        return max(b - a for a, b in itertools.pairwise(times))

    def gap_at(self, line: str) -> float:
        """Wall time at which the widest gap began."""
        times = [t for t, m in self.seen if line in m.split("\n")] + [time.time()]
        return max(itertools.pairwise(times), key=lambda p: p[1] - p[0])[0]

    def last(self, line: str) -> float | None:
        self.pump()
        found = [t for t, m in self.seen if line in m.split("\n")]
        return time.monotonic() - (time.time() - max(found)) if found else None


@pytest.fixture
def served(
    host: Layout, tmp_path: Path, kernel: str, signed: dict[str, Path]
) -> Iterator[tuple[subprocess.Popen[bytes], Notifications, Path]]:
    """``modstage serve --root`` with a test notify socket and a log file; stopped after."""
    host.config.write_text(
        "[limits]\nmax_tree_entries = 20000\nmax_seconds = 20\n"
        "max_decompressed_bytes = 16777216\n"  # what a bomb drop may cost (fuzz_bombs.py)
        "[reboot]\nmin_delay = 3600\n"
    )
    sock_path = tmp_path / "notify.sock"
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    sock.bind(str(sock_path))
    log = tmp_path / "serve.log"
    env = {
        **os.environ,
        "NOTIFY_SOCKET": str(sock_path),
        "WATCHDOG_USEC": str(WATCHDOG_USEC),
    }
    env.pop("WATCHDOG_PID", None)
    with log.open("wb") as err:
        proc = subprocess.Popen(
            [
                sys.executable,
                "-X",
                "faulthandler",
                "-m",
                "service.cli",
                "serve",
                "--root",
                str(host.root),
            ],
            stdout=err,
            stderr=err,
            env=env,
        )
    notes = Notifications(sock)
    stop = threading.Event()
    reader = threading.Thread(target=notes.read_until, args=(stop,), daemon=True)
    reader.start()
    deadline = time.monotonic() + 60
    while notes.last("READY=1") is None:
        assert proc.poll() is None, log.read_text()[-4000:]
        assert time.monotonic() < deadline, "serve never said READY=1"
        time.sleep(0.05)
    try:
        yield proc, notes, log
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
        stop.set()
        reader.join(timeout=5)
        sock.close()


def _template(tmp_path: Path, kernel: str, signed: dict[str, Path]) -> Path:
    into = tmp_path / "template-in"
    into.mkdir()
    drop = stage(
        into,
        bundle="tmpl",
        version="1",
        kernel=kernel,
        modules=[ModuleSpec(signed["ms_exporter"], "")],
    )
    return drop


def _outside(tmp_path: Path) -> Path:
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "canary").write_bytes(b"canary " * 100)
    (outside / "sub").mkdir()
    (outside / "sub" / "secret").write_bytes(b"secret")
    return outside


def _digest_tree(path: Path) -> str:
    h = hashlib.sha256()
    for dirpath, dirs, files in sorted(os.walk(path)):
        for name in sorted(files + dirs):
            p = Path(dirpath) / name
            h.update(str(p).encode())
            if p.is_file() and not p.is_symlink():
                h.update(p.read_bytes())
    return h.hexdigest()


Snapshot = dict[str, tuple[object, ...]]


def _untouched(top: Path, writable: list[Path], canaries: list[Path]) -> Snapshot:
    """Every path below ``top`` but the ``writable`` subtrees, with what a write changes.

    Files: inode, mode, size, mtime; symlinks: inode and target; directories: inode and
    mode (an entry added or removed shows as a path that appears or goes). The canary
    tree is watched for opens, so it is not listed: its known ``canaries`` are only
    ``lstat``-ed, directories with their mtime (which an entry added or removed changes).
    """
    skip = {str(p) for p in writable} | {str(canaries[0])}
    parents = {str(a) for p in writable for a in p.parents}  # made on the way to a place
    seen: Snapshot = {}
    for path in map(str, canaries):
        st = os.lstat(path)
        seen[path] = (st.st_ino, st.st_mode, st.st_size, st.st_mtime_ns)
    for dirpath, dirs, files in os.walk(top):
        dirs[:] = [d for d in dirs if os.path.join(dirpath, d) not in skip]
        for name in [*dirs, *files]:
            path = os.path.join(dirpath, name)
            if path in skip or path in parents:
                continue
            st = os.lstat(path)
            if stat.S_ISDIR(st.st_mode):
                seen[path] = (st.st_ino, st.st_mode)
            elif stat.S_ISLNK(st.st_mode):
                seen[path] = (st.st_ino, os.readlink(path))
            else:
                seen[path] = (st.st_ino, st.st_mode, st.st_size, st.st_mtime_ns)
    return seen


def _changed(before: Snapshot, after: Snapshot) -> list[str]:
    """Paths added, removed or changed between two snapshots."""
    return sorted(p for p in before.keys() | after.keys() if before.get(p) != after.get(p))


def _writable(host: Layout, tmp_path: Path, log: Path) -> list[Path]:
    """Where ``serve`` may write: its own directory, the metrics and run directories, and
    the test's log and notify socket. Everything else of ``tmp_path`` must stay as it was."""
    return [
        host.var,
        host.root / "var/lib/prometheus",
        host.run,
        log,
        tmp_path / "notify.sock",
    ]


def _tail(log: Path) -> str:
    lines = log.read_bytes().splitlines()[-12:]
    return "\n".join(line[:300].decode(errors="replace") for line in lines)


def _bounded(host: Layout, log: Path, cases: int) -> list[str]:
    problems = []
    if host.status.is_dir():
        for f in host.status.iterdir():
            try:
                size = f.stat().st_size
            except FileNotFoundError:
                continue  # a crash-safe write's temporary file, renamed since
            if size > MAX_STATUS_BYTES:
                problems.append(f"{f.name} is {size} bytes")
        # a bundle taken in has its status file, however many there are; rejections
        # leave at most MAX_STATUS_FILES for names state.json does not know
        known = set(state_of(host).bundles)
        unknown = [n for n in os.listdir(host.status) if n.removesuffix(".json") not in known]
        if len(unknown) > MAX_STATUS_FILES:
            problems.append(f"{len(unknown)} status files of names state.json does not know")
    if host.metrics.exists() and host.metrics.stat().st_size > 1 << 20:
        problems.append(f"metrics is {host.metrics.stat().st_size} bytes")
    size = log.stat().st_size
    if size > MAX_LOG_PER_CASE * max(cases, 1) + (1 << 20):
        problems.append(f"log is {size} bytes after {cases} cases")
    with log.open("rb") as f:
        longest = max((len(line) for line in f), default=0)
    if longest > MAX_LOG_LINE:
        problems.append(f"a log line of {longest} bytes")
    records = quarantine.records(host)
    limits = Limits()
    if len(records) > limits.quarantine_drops:
        problems.append(f"{len(records)} quarantine records")
    if sum(r.size for r in records if r.kept) > limits.quarantine_bytes:
        problems.append("the quarantine holds more than its byte limit")
    return problems


def test_hostile_drops_against_running_daemon(
    host: Layout,
    tmp_path: Path,
    kernel: str,
    signed: dict[str, Path],
    served: tuple[subprocess.Popen[bytes], Notifications, Path],
) -> None:
    """Hundreds of hostile drops: the daemon lives, feeds its watchdog, takes in every good
    drop staged meanwhile, opens no planted node nor canary, and writes nowhere but its own
    places."""
    proc, notes, log = served
    before_root = {p: p.exists() for p in ROOT_PATHS}
    outside = _outside(tmp_path)
    outside_digest = _digest_tree(outside)
    canaries = [outside, outside / "canary", outside / "sub", outside / "sub/secret"]
    watch = AccessWatch(canaries)
    nodes = AccessWatch([])
    rng = random.Random(SEED)
    world = World(host.incoming, _template(tmp_path, kernel, signed), outside, [], nodes)
    writable = _writable(host, tmp_path, log)
    untouched = _untouched(tmp_path, writable, canaries)
    kinds: dict[str, int] = {}
    cases = 0
    left_alone: set[str] = set()
    try:
        for rnd in itertools.count():
            for _ in range(PER_ROUND):
                try:
                    kind = rng.choice(GENERATORS + BOMBS)(rng, world).split(":")[0]
                except OSError as exc:  # the fuzzer's own setup lost a race with the daemon
                    kind = f"setup-failed {exc.strerror}"
                kinds[kind] = kinds.get(kind, 0) + 1
                cases += 1
            good = stage(
                host.incoming,
                bundle="good",
                version=f"1.{rnd}",
                kernel=kernel,
                modules=[ModuleSpec(signed["ms_exporter"], "")],
            )
            generation = Manifest.from_toml((good / MANIFEST_NAME).read_bytes()).digest
            deadline = time.monotonic() + GOOD_WITHIN
            while not pending(host, "good", generation):
                assert proc.poll() is None, f"daemon died in round {rnd}: {log.read_text()[-3000:]}"
                assert time.monotonic() < deadline, f"round {rnd}: good drop never pending"
                time.sleep(0.005)
            for thread in world.races:
                thread.join(timeout=5)
            world.races.clear()
            deadline = time.monotonic() + 30
            while drops_left(host):
                assert proc.poll() is None, log.read_text()[-3000:]
                assert time.monotonic() < deadline, f"round {rnd}: left {drops_left(host)}"
                time.sleep(0.02)
            left_alone = clear_non_drops(host, left_alone)
            assert proc.poll() is None
            gap = notes.widest_gap("WATCHDOG=1")
            assert gap < WATCHDOG_USEC / 1e6, (
                f"round {rnd}: watchdog not fed for {gap:.2f} s from "
                f"{datetime.fromtimestamp(notes.gap_at('WATCHDOG=1'), UTC).isoformat()}"
            )
            assert watch.events() == [], f"round {rnd}: opened outside the drop"
            opened = nodes.events()
            assert opened == [], (
                f"round {rnd}: a planted FIFO, device or socket was opened: {opened}"
            )
            assert {p: p.exists() for p in ROOT_PATHS} == before_root, "wrote outside the root"
            changed = _changed(untouched, _untouched(tmp_path, writable, canaries))
            assert changed == [], f"round {rnd}: wrote outside its own places: {changed[:20]}"
            assert _bounded(host, log, cases) == [], f"round {rnd}"
            if cases >= CASES:
                break
    except BaseException:
        if proc.poll() is None:  # where was it? faulthandler writes every thread's stack
            proc.send_signal(signal.SIGABRT)
            proc.wait(timeout=30)
        raise
    finally:
        watch.close()
        nodes.close()
        for thread in world.races:
            thread.join(timeout=5)
    assert _digest_tree(outside) == outside_digest
    assert published_problems(host) == []
    summary = {
        "cases": cases,
        "rounds": rnd + 1,
        "seed": SEED,
        "kinds": dict(sorted(kinds.items())),
        "widest_watchdog_gap_s": round(notes.widest_gap("WATCHDOG=1"), 3),
        "widest_gap_from": datetime.fromtimestamp(notes.gap_at("WATCHDOG=1"), UTC).isoformat(),
    }
    print("fuzz:", json.dumps(summary))
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=30) == 0
    with contextlib.suppress(FileNotFoundError):
        assert os.listdir(host.incoming) == [] or drops_left(host) == []

"""The hostile-drop catalogue: every way a container might trick the host, and the reason given.

For each case: the drop is rejected with exactly the expected reason, the intake
finishes (a planted FIFO or device cannot block it), no file outside the drop is
opened or read (inotify ``IN_OPEN | IN_ACCESS`` on a canary directory and on
``/etc/shadow``), no FIFO, device node or socket planted in the drop is opened
(the same watch on each planted node: only ``O_PATH``, which reports nothing, may
reach it), and another bundle's state, status and store stay byte-for-byte as
they were.
"""

from __future__ import annotations

import os
import re
import shutil
import stat
import threading
import time
from pathlib import Path

import pytest

from service.bundles.phase import Phase
from service.bundles.statefile import load
from service.config import Config
from service.intake.scan import Outcome
from service.layout import Layout
from stager.schema.paths import MANIFEST_NAME, parse_drop_name
from tests.hardening.conftest import make_intake, stage_drop
from tests.hardening.hostile_case import SHADOW, Case, Ctx, M, moved_out
from tests.hardening.hostile_content import CONTENT_CASES
from tests.hardening.hostile_files import FILE_CASES
from tests.hardening.watch import AccessWatch, special_files
from tests.kmod import SigningKey, sign

CASES = [*FILE_CASES, *CONTENT_CASES]


def _run_intake(layout: Layout, config: Config, timeout: float = 30.0) -> list[Outcome]:
    """Run one intake in a thread; fail if it does not return within ``timeout``."""
    result: list[list[Outcome]] = []
    thread = threading.Thread(target=lambda: result.append(make_intake(layout, config).run()))
    thread.daemon = True
    thread.start()
    thread.join(timeout)
    assert not thread.is_alive(), "intake blocked"
    return result[0]


def _watch(outside: Path) -> AccessWatch:
    """Watch every directory and file outside the drop (a file watch follows its inode,
    so it also sees an open through a hard link planted in the drop)."""
    paths = [Path(d) / n for d, dirs, files in os.walk(outside) for n in [".", *dirs, *files]]
    return AccessWatch([*paths, SHADOW])


def _watch_nodes(incoming: Path) -> AccessWatch:
    """Watch every FIFO, device node and socket planted in the incoming directory."""
    return AccessWatch(special_files(incoming))


def _snapshot(layout: Layout) -> tuple[bytes, bytes, list[str]]:
    return (
        layout.state.read_bytes(),
        (layout.status / "other.json").read_bytes(),
        sorted(p.name for p in layout.store.iterdir()),
    )


@pytest.fixture
def ctx(
    host: Layout,
    kernel: str,
    signed: dict[str, Path],
    modules: dict[str, Path],
    other_key: SigningKey,
    firmware_dir: Path,
    tmp_path: Path,
) -> Ctx:
    """Another bundle taken in first, then a good drop of bundle ``test`` to spoil."""
    stage_drop(host, kernel, [signed["ms_params"]], bundle="other")
    [taken] = make_intake(host).run()
    assert taken.accepted, taken.reasons
    drop = stage_drop(host, kernel, [signed["ms_exporter"]], firmware=(firmware_dir,))
    outside = tmp_path / "outside"
    outside.mkdir()
    shutil.copyfile(signed["ms_exporter"], outside / "canary.ko")
    (outside / "secret.txt").write_text("the host's secret\n")
    untrusted = sign(modules["ms_exporter"], other_key, tmp_path / "untrusted.ko")
    return Ctx(drop, outside, host, signed, kernel, untrusted, modules["ms_exporter"])


def test_catalogue_is_large_and_distinct() -> None:
    """The catalogue holds at least 50 distinct cases."""
    ids = [c.id for c in CASES]
    assert len(ids) >= 50 and len(set(ids)) == len(ids), ids


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_hostile_drop_is_rejected_with_its_reason(ctx: Ctx, case: Case) -> None:
    """Rejected with exactly the expected reason; nothing outside read; nothing else changed."""
    expected = case.plant(ctx)
    before = _snapshot(ctx.layout)
    watch, nodes = _watch(ctx.outside), _watch_nodes(ctx.layout.incoming)
    try:
        outcomes = _run_intake(ctx.layout, case.config)
        seen, opened = watch.events(), nodes.events()
    finally:
        watch.close()
        nodes.close()
    [outcome] = outcomes
    if any(kind in case.id for kind in ("fifo", "socket", "chardev", "blockdev")):
        assert nodes.paths, "the case planted a node and the node is watched"
    assert not outcome.accepted and not outcome.deferred
    assert len(outcome.reasons) == len(expected), outcome.reasons
    # the reasons name the drop where an admin finds it: under the quarantine
    kept = str(ctx.layout.quarantine / ctx.drop.name)
    for got, want in zip(outcome.reasons, expected, strict=True):
        if isinstance(want, re.Pattern):
            moved = want.pattern.replace(re.escape(str(ctx.drop)), re.escape(kept))
            assert re.compile(moved, want.flags).fullmatch(got), got
        else:
            assert got == want.replace(str(ctx.drop), kept)
    assert seen == [], f"opened or read outside the drop: {seen}"
    assert opened == [], f"a planted FIFO, device node or socket was opened: {opened}"
    assert _snapshot(ctx.layout) == before
    assert not os.path.lexists(ctx.drop), "a rejected drop is removed from incoming/"
    assert (ctx.layout.quarantine / f"{ctx.drop.name}.json").is_file(), "and quarantined"
    status_file = ctx.layout.status / f"{outcome.bundle}.json"
    allowed = case.config.allowed_bundles if case.config else ()
    if outcome.bundle is None:  # named for one bundle, its manifest for another: for neither
        named = parse_drop_name(ctx.drop.name)
        assert named is not None and not (ctx.layout.status / f"{named[0]}.json").exists()
        assert not (ctx.layout.status / "test.json").exists()
    elif allowed and outcome.bundle not in allowed:
        assert not status_file.exists(), "a disallowed name leaves no per-name status"
    else:
        assert '"phase": "rejected"' in status_file.read_text()


@pytest.mark.parametrize(
    "name",
    [
        b"test.\n00000000000000000001.ab",
        b"test.\xff\xfe.00000000000000000001.ab",
        b"Test.00000000000000000001.ab",
        b"../test.00000000000000000001.ab"[3:] + b".x",
    ],
    ids=["newline", "non-utf8", "uppercase-bundle", "bad-key"],
)
def test_entries_that_are_not_drops_are_left_alone(ctx: Ctx, name: bytes) -> None:
    """An incoming entry whose name is not a drop name is ignored: not read, not removed."""
    odd = Path(os.fsdecode(os.fsencode(ctx.layout.incoming) + b"/" + name))
    os.rename(ctx.drop, odd)
    (odd / "modules/link.ko").symlink_to(ctx.outside / "canary.ko")
    before = _snapshot(ctx.layout)
    watch = _watch(ctx.outside)
    try:
        outcomes = _run_intake(ctx.layout, Config())
        seen = watch.events()
    finally:
        watch.close()
    assert outcomes == []
    assert seen == []
    assert os.path.isdir(odd)
    assert _snapshot(ctx.layout) == before


def test_fifo_named_like_a_drop_is_left_alone(ctx: Ctx) -> None:
    """A FIFO (or file) in incoming/ with a drop's name is no drop: the intake returns at once,
    never having opened the FIFO."""
    fifo = ctx.layout.incoming / "test.00000000000000000001.ab"
    os.mkfifo(fifo)
    (ctx.layout.incoming / "test.00000000000000000002.ab").write_text("x")
    shutil.rmtree(ctx.drop)
    nodes = _watch_nodes(ctx.layout.incoming)
    try:
        assert _run_intake(ctx.layout, Config(), timeout=10) == []
        opened = nodes.events()
    finally:
        nodes.close()
    assert list(nodes.paths.values()) == [fifo] and opened == []


def test_unlisted_hostile_files_are_never_opened(ctx: Ctx) -> None:
    """Links, FIFOs, devices, odd names and a deep tree the manifest does not name: never read.

    The drop is accepted; removing it unlinks the hard link, never the canary.
    """
    extra = ctx.drop / "extra"
    extra.mkdir()
    (extra / "to-canary").symlink_to(ctx.outside / "canary.ko")
    (extra / "to-shadow").symlink_to(SHADOW)
    os.link(ctx.outside / "secret.txt", extra / "hard-secret")
    os.mkfifo(extra / "fifo")
    os.mknod(extra / "zero", stat.S_IFCHR | 0o600, os.makedev(1, 5))
    os.mknod(extra / "sock", stat.S_IFSOCK | 0o600)
    (extra / "new\nline").write_text("x")
    Path(os.fsdecode(os.fsencode(extra) + b"/bad-\xff-name")).write_text("x")
    deep = extra
    for _ in range(200):
        deep = deep / "d"
    deep.mkdir(parents=True)
    (deep / "leaf").symlink_to(ctx.outside)
    os.mkfifo(deep / "fifo")
    watch, nodes = _watch(ctx.outside), _watch_nodes(ctx.layout.incoming)
    assert len(nodes.paths) == 4  # the FIFOs, the device node, the socket
    try:
        [outcome] = _run_intake(ctx.layout, Config())
        seen, opened = watch.events(), nodes.events()
    finally:
        watch.close()
        nodes.close()
    assert outcome.accepted, outcome.reasons
    assert seen == []
    assert opened == [], f"a planted FIFO, device node or socket was opened: {opened}"
    assert not os.path.lexists(ctx.drop)
    assert (ctx.outside / "secret.txt").stat().st_nlink == 1
    assert (ctx.outside / "canary.ko").is_file() and SHADOW.is_file()


def test_canary_watch_sees_a_read(ctx: Ctx) -> None:
    """The watch is not blind: reading the canary through a symlink is reported."""
    watch = _watch(ctx.outside)
    try:
        (ctx.drop / "peek").symlink_to(ctx.outside / "canary.ko")
        (ctx.drop / "peek").read_bytes()
        seen = watch.events()
    finally:
        watch.close()
    assert (str(ctx.outside / "canary.ko"), "open") in seen
    assert (str(ctx.outside / "canary.ko"), "access") in seen


def test_node_watch_sees_an_open_of_a_fifo_and_a_device(ctx: Ctx) -> None:
    """The node watch is not blind: a non-blocking open of a planted FIFO or device node
    (what ``O_RDONLY | O_NONBLOCK`` instead of ``O_PATH`` would do) is reported, while an
    ``O_PATH`` open, the product's way to look before opening, is not."""
    os.mkfifo(ctx.drop / "fifo")
    os.mknod(ctx.drop / "zero", stat.S_IFCHR | 0o600, os.makedev(1, 5))
    nodes = _watch_nodes(ctx.layout.incoming)
    try:
        for name in ("fifo", "zero"):
            os.close(os.open(ctx.drop / name, os.O_PATH | os.O_NOFOLLOW))
        quiet = nodes.events()
        for name in ("fifo", "zero"):
            os.close(os.open(ctx.drop / name, os.O_RDONLY | os.O_NONBLOCK))
        seen = nodes.events()
    finally:
        nodes.close()
    assert quiet == []
    assert sorted(seen) == [(f"{ctx.d}/fifo", "open"), (f"{ctx.d}/zero", "open")], seen


def test_canary_watch_sees_an_open_through_a_hard_link(ctx: Ctx) -> None:
    """Opening the canary's inode through a hard link inside the drop is reported too."""
    os.link(ctx.outside / "secret.txt", ctx.drop / "hard")
    watch = _watch(ctx.outside)
    try:
        os.close(os.open(ctx.drop / "hard", os.O_RDONLY))
        seen = watch.events()
    finally:
        watch.close()
    assert any(
        kind == "open" and path.startswith(str(ctx.outside / "secret.txt")) for path, kind in seen
    ), seen


def test_daemon_loop_stays_responsive_with_fifo_drops(ctx: Ctx) -> None:
    """The daemon's loop takes FIFO drops (a FIFO module, a FIFO manifest) without blocking
    and without opening either FIFO (inotify on both).

    A good drop staged afterwards is still taken in, and the loop stops when asked.
    """
    from service.daemon.events import Event, Kind
    from service.daemon.loop import Daemon
    from service.daemon.watcher import DropWatcher
    from service.rebooting.request import NoRebooter

    good = ctx.drop.with_name("keep")
    shutil.copytree(ctx.drop, good)
    ctx.replace_with(M, os.mkfifo)
    second = stage_drop(ctx.layout, ctx.kernel, [ctx.signed["ms_params"]], bundle="fifo")
    moved_out(
        Ctx(second, ctx.outside, ctx.layout, ctx.signed, ctx.kernel, ctx.untrusted, ctx.unsigned),
        MANIFEST_NAME,
    )
    os.mkfifo(second / MANIFEST_NAME)
    nodes = _watch_nodes(ctx.layout.incoming)
    assert len(nodes.paths) == 2
    daemon = Daemon(ctx.layout, Config(), make_intake(ctx.layout), NoRebooter(), debounce=0.05)
    watcher = DropWatcher([ctx.layout.incoming], daemon.events)
    watcher.start()
    thread = threading.Thread(target=daemon.loop, daemon=True)
    thread.start()
    try:
        deadline = time.monotonic() + 20
        status = ctx.layout.status
        while not all(
            (status / f"{b}.json").is_file() and '"rejected"' in (status / f"{b}.json").read_text()
            for b in ("test", "fifo")
        ):
            assert time.monotonic() < deadline and thread.is_alive(), "FIFO drops blocked the loop"
            time.sleep(0.02)
        shutil.move(good, ctx.layout.incoming / ctx.drop.name.replace("0", "1", 1))
        daemon.events.put(Event(Kind.DROP, "test"))
        while load(ctx.layout.state).bundle("test").phase is not Phase.PENDING:
            assert time.monotonic() < deadline and thread.is_alive(), "loop unresponsive"
            time.sleep(0.02)
        opened = nodes.events()
    finally:
        daemon.events.put(Event(Kind.STOP))
        thread.join(10)
        watcher.stop()
        nodes.close()
    assert not thread.is_alive()
    assert opened == [], f"a planted FIFO was opened: {opened}"

"""The kernel watch: a kernel installed or removed under a temporary root is noticed through
real inotify (the installed watchdog), and the daemon refreshes the next kernel's
announcement at once, taking drops in only when the package's hook says its files are in
place. The hook itself: ``deploy/kernel/zzz-modstage`` run as run-parts runs it (and by
Debian's run-parts, in the test marked ``debian``)."""

from __future__ import annotations

import json
import os
import queue
import shutil
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from structlog.testing import capture_logs

from service.bundles.state import State
from service.config import Config
from service.daemon.events import Event, Kind
from service.daemon.kernelwatch import KernelWatcher, kernel_dirs
from service.daemon.loop import Daemon
from service.daemon.timers import Timers
from service.layout import Layout, kernel_image, modules_dir
from service.publish.announce import HOST_FILE
from service.publish.labels import features_file
from service.rebooting.request import NoRebooter
from tests.service.fake_clock import FakeClock
from tests.service.test_reboot_required import KERNEL, active, host

REPO = Path(__file__).resolve().parents[2]
HOOK = REPO / "deploy/kernel/zzz-modstage"
NEW = "6.12.0-new"


class CountingIntake:
    """An intake with nothing to take in, counting its scans."""

    def __init__(self) -> None:
        self.scans = 0

    def run(self) -> list[Any]:
        """One scan of the incoming directories: nothing complete."""
        self.scans += 1
        return []


def _node(root: Path) -> Layout:
    """A host running KERNEL (its image and tree installed) with bundle demo active for it,
    grub's directory and node-feature-discovery's ``features.d``, no grub.cfg (the next
    kernel is the newest installed one with an image)."""
    layout = host(root, State({"demo": active()}), "")
    for directory in (layout.grub_dir, modules_dir(layout, KERNEL), layout.status):
        directory.mkdir(parents=True)
    kernel_image(layout, KERNEL).write_bytes(b"MZ")
    features_file(layout).parent.mkdir(parents=True)
    return layout


def _install(layout: Layout, release: str) -> None:
    """``release`` unpacked as dpkg does: its tree, then its image renamed into place."""
    (modules_dir(layout, release) / "kernel").mkdir(parents=True)
    staged = layout.boot / f"vmlinuz-{release}.dpkg-new"
    staged.write_bytes(b"MZ")
    staged.rename(layout.boot / f"vmlinuz-{release}")


def _remove(layout: Layout, release: str) -> None:
    (layout.boot / f"vmlinuz-{release}").unlink()
    shutil.rmtree(modules_dir(layout, release))


def _run_hook(root: Path, kind: str, release: str = NEW) -> subprocess.CompletedProcess[str]:
    """The hook as a kernel package's run-parts runs it from ``/etc/kernel/<kind>.d``: that
    path, the release as its argument, dpkg's ``DPKG_ROOT`` in its environment (run-parts
    itself: :func:`test_the_hook_runs_after_debians_own_hooks_and_never_fails_run_parts`)."""
    hooks = root / f"etc/kernel/{kind}.d"
    hooks.mkdir(parents=True, exist_ok=True)
    shutil.copy(HOOK, hooks / HOOK.name)
    return subprocess.run(
        [str(hooks / HOOK.name), release],
        env={"PATH": os.environ["PATH"], "DPKG_ROOT": str(root)},
        capture_output=True,
        text=True,
        check=False,
    )


def _events(events: queue.Queue[Event], quiet: float = 0.5) -> list[Event]:
    """Every event until none came for ``quiet`` seconds."""
    seen = []
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        try:
            seen.append(events.get(timeout=quiet))
        except queue.Empty:
            break
    return seen


@pytest.fixture
def watched(tmp_path: Path) -> Iterator[tuple[Layout, queue.Queue[Event]]]:
    """A node and a started kernel watch over it; stopped afterwards."""
    layout = _node(tmp_path / "root")
    events: queue.Queue[Event] = queue.Queue()
    watcher = KernelWatcher(layout, events)
    watcher.start()
    try:
        yield layout, events
    finally:
        watcher.stop()


def test_a_kernel_installed_or_removed_and_grubs_menu_rewritten_are_kernel_events(
    watched: tuple[Layout, queue.Queue[Event]],
) -> None:
    """A module tree made or removed in ``lib/modules``, an image renamed into or removed
    from the boot directory, and grub.cfg renamed into place (``update-grub``) are each a
    KERNEL event naming the path."""
    layout, events = watched
    _install(layout, NEW)
    seen = _events(events)
    assert {e.kind for e in seen} == {Kind.KERNEL}
    details = {e.detail for e in seen}
    assert str(modules_dir(layout, NEW)) in details
    assert str(layout.boot / f"vmlinuz-{NEW}") in details
    (layout.grub_dir / "grub.cfg.new").write_text("")
    (layout.grub_dir / "grub.cfg.new").rename(layout.grub_cfg)
    assert str(layout.grub_cfg) in {e.detail for e in _events(events)}
    _remove(layout, NEW)
    gone = {e.detail for e in _events(events) if e.kind is Kind.KERNEL}
    assert {str(modules_dir(layout, NEW)), str(layout.boot / f"vmlinuz-{NEW}")} <= gone


def test_files_inside_a_module_tree_and_reading_the_kernels_raise_nothing(
    watched: tuple[Layout, queue.Queue[Event]],
) -> None:
    """Not recursive: a package's thousands of module files raise nothing once its tree is
    there, and the daemon (or its intake child) reading an image, grub's files or a tree
    does not call for another refresh."""
    layout, events = watched
    tree = modules_dir(layout, KERNEL)
    (tree / "kernel/drivers").mkdir(parents=True)
    for i in range(50):
        (tree / "kernel/drivers" / f"m{i}.ko").write_bytes(b"\0" * 64)
    (tree / "modules.dep").write_text("")
    _events(events, quiet=0.3)  # modules.dep is in the tree: no event either way
    kernel_image(layout, KERNEL).read_bytes()
    list(os.scandir(layout.boot))
    list(os.scandir(tree.parent))
    assert _events(events) == []


def test_the_hook_is_one_event_and_the_kernel_watch_skips_what_is_missing(
    tmp_path: Path,
) -> None:
    """The package's hook, run by run-parts as a kernel package runs it, is exactly one
    KERNEL_HOOK event per run (its temporary file raises none), naming ``installed`` from
    postinst.d and ``removed`` from postrm.d, the release inside. A root without grub's
    directory watches the rest; a merged-/usr root watches its module trees' one directory
    once."""
    layout = _node(tmp_path / "root")
    shutil.rmtree(layout.grub_dir)
    (layout.root / "usr/lib").mkdir(parents=True)
    (layout.root / "lib/modules").rename(layout.root / "usr/lib/modules")
    (layout.root / "lib/modules").symlink_to("../usr/lib/modules")
    assert kernel_dirs(layout) == [
        layout.boot.resolve(),
        (layout.root / "usr/lib/modules").resolve(),
    ]
    events: queue.Queue[Event] = queue.Queue()
    watcher = KernelWatcher(layout, events)
    watcher.start()
    try:
        assert _run_hook(layout.root, "postinst").returncode == 0
        assert [(e.kind, e.detail) for e in _events(events)] == [
            (Kind.KERNEL_HOOK, str(layout.kernel_hook / "installed"))
        ]
        assert (layout.kernel_hook / "installed").read_text() == f"installed {NEW}\n"
        assert _run_hook(layout.root, "postrm").returncode == 0
        assert [e.detail for e in _events(events)] == [str(layout.kernel_hook / "removed")]
    finally:
        watcher.stop()
    assert sorted(os.listdir(layout.kernel_hook)) == ["installed", "removed"]


@pytest.mark.parametrize("kind", ["postinst", "postrm"])
def test_the_hook_never_fails_the_kernels_install(tmp_path: Path, kind: str) -> None:
    """run-parts ``--exit-on-error`` fails the kernel package's configure on a hook's failure:
    without modstage's run directory (the daemon never ran this boot, or modstage is removed
    and its hook left as a conffile), with a file in its place, or without the release
    argument, the hook exits 0, says nothing and writes nothing."""
    bare = tmp_path / "bare"
    result = _run_hook(bare, kind)
    assert (result.returncode, result.stdout, result.stderr) == (0, "", "")
    assert not (bare / "run").exists()
    odd = tmp_path / "odd"
    (odd / "run/modstage").mkdir(parents=True)
    (odd / "run/modstage/kernel-hook").write_text("")
    result = _run_hook(odd, kind)
    assert (result.returncode, result.stderr) == (0, "")
    assert os.listdir(odd / "run/modstage") == ["kernel-hook"]
    env = {"PATH": os.environ["PATH"], "DPKG_ROOT": str(bare)}
    assert subprocess.run(["sh", str(HOOK)], env=env, check=False).returncode == 0  # no release


@pytest.mark.debian
def test_the_hook_runs_after_debians_own_hooks_and_never_fails_run_parts(tmp_path: Path) -> None:
    """Debian's run-parts orders the hooks by name: modstage's runs after initramfs-tools
    and zz-update-grub (grub's menu names the new kernel by then), and at all (its name is
    one run-parts accepts). Run as the kernel package runs it, ``--exit-on-error`` on a root
    where the daemon never ran, it succeeds silently. The directory it writes to is the one
    the daemon watches."""
    names = ["initramfs-tools", "zz-update-grub", HOOK.name, "dkms"]
    order = tmp_path / "order"
    order.mkdir()
    for name in names:
        (order / name).write_text("#!/bin/sh\n")
        (order / name).chmod(0o755)
    listed = subprocess.run(
        ["run-parts", "--test", str(order)], capture_output=True, text=True, check=True
    ).stdout.split()
    assert [os.path.basename(n) for n in listed] == sorted(names)
    assert os.path.basename(listed[-1]) == HOOK.name
    bare = tmp_path / "bare"
    hooks = bare / "etc/kernel/postinst.d"
    hooks.mkdir(parents=True)
    shutil.copy(HOOK, hooks / HOOK.name)
    argv = ["run-parts", "--report", "--exit-on-error", f"--arg={NEW}", f"--arg=/boot/x-{NEW}"]
    ran = subprocess.run(
        [*argv, str(hooks)],
        env={"PATH": os.environ["PATH"], "DPKG_ROOT": str(bare)},
        capture_output=True,
        text=True,
        check=False,
    )
    assert (ran.returncode, ran.stdout, ran.stderr) == (0, "", "")
    assert "/run/modstage/kernel-hook" in HOOK.read_text()
    assert Layout(Path("/")).kernel_hook == Path("/run/modstage/kernel-hook")


def _daemon(layout: Layout, clock: object = None) -> Daemon:
    """A daemon on ``layout`` whose intake only counts its scans; no reboot backend."""
    kwargs: dict[str, Any] = {} if clock is None else {"clock": clock}
    config = Config.load(layout.config)
    return Daemon(layout, config, CountingIntake(), NoRebooter(), rescan_every=3600, **kwargs)


def _scans(daemon: Daemon) -> int:
    assert isinstance(daemon.intake, CountingIntake)
    return daemon.intake.scans


def _announced(layout: Layout) -> dict[str, Any]:
    try:
        doc: dict[str, Any] = json.loads((layout.status / HOST_FILE).read_text())
    except (OSError, ValueError):
        return {}
    return doc


def _wait(predicate: Any, what: str, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.02)


def test_the_daemon_announces_a_kernel_installed_or_removed_within_seconds(
    tmp_path: Path,
) -> None:
    """The daemon's loop with the real kernel watch and an hour between periodic scans: a
    kernel unpacked into the node is in ``_host.json`` (next kernel, installed, ``demo:
    none``) and the labels (``demo.next=none``) within seconds, and its removal too, with
    no drop scan for either (a package still unpacking has half a tree); the package's
    hook is one full scan (a drop that waited for the kernel's tree is taken in then)."""
    layout = _node(tmp_path / "root")
    daemon = _daemon(layout)
    daemon.kernel_debounce = 0.2
    watcher = KernelWatcher(layout, daemon.events)
    watcher.start()
    thread = threading.Thread(target=daemon.loop, daemon=True)
    thread.start()
    try:
        _wait(lambda: _announced(layout).get("next_kernel") == KERNEL, "the first scan")
        assert _scans(daemon) == 1
        started = time.monotonic()
        _install(layout, NEW)
        _wait(lambda: _announced(layout).get("next_kernel") == NEW, "the new kernel announced")
        took = time.monotonic() - started
        doc = _announced(layout)
        assert doc["installed"] == [NEW, KERNEL] and doc["bundles"] == {"demo": {"next": "none"}}
        assert "modstage.io/demo.next=none" in features_file(layout).read_text()
        assert took < 5, took
        assert _scans(daemon) == 1
        assert _run_hook(layout.root, "postinst").returncode == 0
        _wait(lambda: _scans(daemon) == 2, "the hook's scan")
        _remove(layout, NEW)
        _wait(lambda: _announced(layout).get("next_kernel") == KERNEL, "the removal announced")
        assert _announced(layout)["installed"] == [KERNEL]
        assert _scans(daemon) == 2
    finally:
        daemon.events.put(Event(Kind.STOP))
        thread.join(timeout=10)
        watcher.stop()
    assert not thread.is_alive()


def test_a_burst_of_kernel_events_is_one_refresh_after_the_debounce(tmp_path: Path) -> None:
    """Events of one package's files (a tree, an image, grub's menu) refresh nothing at once;
    ``kernel_debounce`` after the first, one refresh names them all and announces the new
    kernel, takes no drop in, and the pass decides the reboot again (the heartbeat says
    so). A hook event in the same span is a drop scan after the drop debounce instead."""
    layout = _node(tmp_path / "root")
    clock = FakeClock()
    daemon = _daemon(layout, clock)
    clock.run_for(1)
    daemon.loop()  # the first pass: scan, announce, heartbeat
    assert _scans(daemon) == 1 and _announced(layout)["next_kernel"] == KERNEL
    _install(layout, NEW)
    timers = Timers.start(clock.mono, daemon.rescan_every, None)
    timers.dirty = None
    burst = [Event(Kind.KERNEL, str(modules_dir(layout, NEW))), Event(Kind.KERNEL, "vmlinuz")]
    with capture_logs() as logs:
        daemon.step(burst, timers)
        clock.advance(daemon.kernel_debounce / 2)
        daemon.step([Event(Kind.KERNEL, str(layout.grub_cfg))], timers)
        assert _announced(layout)["next_kernel"] == KERNEL
        clock.advance(daemon.kernel_debounce / 2)
        daemon.next_beat = 0.0  # a heartbeat is due: the pass's decision is written
        daemon.step([], timers)
    changed = [e for e in logs if e["event"] == "kernels.changed"]
    assert [e["paths"] for e in changed] == [
        [str(modules_dir(layout, NEW)), "vmlinuz", str(layout.grub_cfg)]
    ]
    assert _announced(layout)["next_kernel"] == NEW and timers.kernel is None
    assert _scans(daemon) == 1
    assert json.loads(layout.heartbeat.read_text())["at"] == clock.now().timestamp()
    with capture_logs() as logs:
        daemon.step([Event(Kind.KERNEL_HOOK, str(layout.kernel_hook / "installed"))], timers)
        assert timers.dirty == clock.mono + daemon.debounce
        clock.advance(daemon.debounce)
        daemon.step([], timers)
    assert _scans(daemon) == 2
    assert [e["files"] for e in logs if e["event"] == "kernels.hook"] == [
        [str(layout.kernel_hook / "installed")]
    ]


def test_a_watch_that_cannot_be_placed_is_logged_and_the_rest_still_watch(
    tmp_path: Path,
) -> None:
    """The boot directory (grub's in it) gone between the watch's making and its start, and
    the hook's directory impossible to make (a file where its parent should be): each is
    logged as unwatched with the reason, start() does not raise (the daemon and its drop watch go
    on), and the module trees' watch still reports a kernel's tree."""
    layout = _node(tmp_path / "root")
    events: queue.Queue[Event] = queue.Queue()
    watcher = KernelWatcher(layout, events)
    shutil.rmtree(layout.boot)
    layout.run.mkdir(parents=True)
    layout.kernel_hook.parent.rmdir()
    layout.kernel_hook.parent.write_text("")
    with capture_logs() as logs:
        watcher.start()
    try:
        (modules_dir(layout, NEW)).mkdir()
        assert [e.detail for e in _events(events)] == [str(modules_dir(layout, NEW))]
    finally:
        watcher.stop()
    [unwatched] = [e for e in logs if e["event"] == "kernels.unwatched"]
    gone = {str(layout.boot.resolve()), str(layout.grub_dir.resolve()), str(layout.kernel_hook)}
    assert set(unwatched["dirs"]) == gone
    [watching] = [e for e in logs if e["event"] == "kernels.watching"]
    assert str(layout.root.resolve() / "lib/modules") in watching["dirs"]

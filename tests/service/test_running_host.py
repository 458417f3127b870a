"""The running host's facts are read once, under one failure rule, and ``Layout`` only
names paths (service/host/running.py, service/layout.py)."""

from __future__ import annotations

import builtins
import inspect
import io
import os
from pathlib import Path
from typing import Any

import pytest

from service.errors import HostFactUnreadable, ServiceError
from service.host.running import RunningHost
from service.layout import Layout
from tests.hosts import BOOT_ID, KEEP, running_host


def test_a_host_with_both_facts_reads_them(tmp_path: Path) -> None:
    """Release and boot id come back stripped, as procfs holds them; a temporary root is a
    sandbox."""
    host = RunningHost.read(running_host(tmp_path, "6.12.57+deb13-amd64"))
    assert (host.release, host.boot_id, host.sandboxed) == ("6.12.57+deb13-amd64", BOOT_ID, True)
    assert host.need_release() == "6.12.57+deb13-amd64" and host.need_boot_id() == BOOT_ID


def test_an_unreadable_release_is_none_and_needing_it_names_the_file(tmp_path: Path) -> None:
    """No ``osrelease``: the release is None, the boot id still read; a caller that needs
    the release gets HostFactUnreadable naming the file and the reason, which is a
    ServiceError (the CLI's message, exit 1) and an OSError (what the reads raised before)."""
    layout = running_host(tmp_path, None)
    host = RunningHost.read(layout)
    assert (host.release, host.boot_id) == (None, BOOT_ID)
    with pytest.raises(HostFactUnreadable) as caught:
        host.need_release()
    assert isinstance(caught.value, ServiceError) and isinstance(caught.value, OSError)
    assert caught.value.path == str(layout.os_release)
    assert str(caught.value) == f"{layout.os_release} could not be read (No such file or directory)"


def test_an_empty_or_binary_release_is_unreadable_too(tmp_path: Path) -> None:
    """An empty file says nothing: it is unreadable (no kernel named ``""``); bytes that are
    not text are too."""
    layout = running_host(tmp_path, "")
    with pytest.raises(HostFactUnreadable, match=r"could not be read \(it is empty\)"):
        RunningHost.read(layout).need_release()
    layout.os_release.write_bytes(b"\xff\xfe\n")
    assert RunningHost.read(layout).release is None


def test_an_unreadable_boot_id_is_none_and_needing_it_names_the_file(tmp_path: Path) -> None:
    """No ``boot_id``: the boot id is None, the release still read; each caller that needs
    it gets its own error naming the file (one snapshot, raised as often as it is needed)."""
    layout = running_host(tmp_path, "6.1.0-test", None)
    host = RunningHost.read(layout)
    assert (host.release, host.boot_id) == ("6.1.0-test", None)
    errors = []
    for _ in range(2):
        with pytest.raises(HostFactUnreadable) as caught:
            host.need_boot_id()
        errors.append(caught.value)
    assert errors[0] is not errors[1]
    assert all(e.path == str(layout.boot_id) and "No such file" in e.reason for e in errors)


def test_the_snapshot_does_not_follow_later_changes(tmp_path: Path) -> None:
    """Read once: a later change of the files (a test playing a reboot) is seen only by a
    new snapshot."""
    layout = running_host(tmp_path, "6.1.0-a", "boot-1")
    before = RunningHost.read(layout)
    running_host(layout, KEEP, "boot-2")
    assert before.boot_id == "boot-1" and RunningHost.read(layout).boot_id == "boot-2"


def test_only_the_machines_own_root_is_not_a_sandbox(tmp_path: Path) -> None:
    """``/`` and a link to it are the host; any other root, even one that does not exist,
    is a sandbox."""
    (tmp_path / "slash").symlink_to("/")
    assert not RunningHost.read(Layout()).sandboxed
    assert not RunningHost.read(Layout(tmp_path / "slash")).sandboxed
    assert RunningHost.read(Layout(tmp_path / "absent")).sandboxed


def _watched(monkeypatch: pytest.MonkeyPatch, touched: list[str]) -> None:
    """Record in ``touched`` every way pathlib reaches the filesystem (each call still made)."""
    for module, name in (
        (os, "stat"),
        (os, "lstat"),
        (os, "open"),
        (os, "listdir"),
        (os, "scandir"),
        (os, "readlink"),
        (os.path, "exists"),
        (os.path, "isdir"),
        (os.path, "realpath"),
        (io, "open"),
        (builtins, "open"),
    ):
        real = getattr(module, name)

        def watch(*args: object, _real: Any = real, _name: str = name, **kwargs: object) -> Any:
            touched.append(f"{_name}{args}")
            return _real(*args, **kwargs)

        monkeypatch.setattr(module, name, watch)


def test_layout_answers_every_path_without_touching_the_filesystem(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Layout is a path contract: over a root that does not exist, each property and each
    method answers a path under the root, and no call reaches the filesystem."""
    root = tmp_path / "nowhere"
    layout = Layout(root)
    paths: list[Path] = []
    touched: list[str] = []
    with monkeypatch.context() as patch:
        _watched(patch, touched)
        (root / "etc").exists()  # the watch holds: a look at the disk is seen
        seen, touched[:] = list(touched), []
        for name in (n for n in dir(Layout) if not n.startswith("_") and n != "root"):
            value = getattr(layout, name)
            if callable(value):  # a method: of a release (or a config path), or of nothing
                takes = inspect.signature(value).parameters
                value = value("6.1.0-test") if takes else value()
            paths.extend(value if isinstance(value, tuple) else [value])
    assert seen and touched == []
    assert len(paths) >= 30
    assert all(isinstance(p, Path) and p.is_relative_to(root) for p in paths), paths

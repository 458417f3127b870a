"""Every default path hangs off one root."""

from __future__ import annotations

from pathlib import Path

from service.host.running import RunningHost
from service.layout import Layout
from tests.hosts import running_host


def test_every_path_is_under_the_root(tmp_path: Path) -> None:
    """With --root PREFIX, each path modstage knows lies under PREFIX."""
    layout = Layout(tmp_path)
    paths = [
        getattr(layout, name) for name in dir(Layout) if isinstance(getattr(Layout, name), property)
    ]
    assert len(paths) >= 12
    for path in paths:
        assert path.is_relative_to(tmp_path), path


def test_default_root_is_the_real_filesystem() -> None:
    """Without a prefix the paths are the documented ones."""
    layout = Layout()
    assert layout.state == Path("/var/lib/modstage/state.json")
    assert layout.trusted == Path("/etc/modstage/trusted.d")
    assert layout.boot_id == Path("/proc/sys/kernel/random/boot_id")


def test_kernel_release_is_read_under_the_root(tmp_path: Path) -> None:
    """The running kernel's release comes from procfs under the root."""
    layout = running_host(tmp_path, "6.1.0-57-amd64")
    assert RunningHost.read(layout).release == "6.1.0-57-amd64"

"""The one memory-block walk and the live-module walk, both through ``Sysfs``."""

from __future__ import annotations

from pathlib import Path

from service.host.memory import Block, blocks, walk
from service.host.modules import LinuxKernel, live_modules
from service.host.sysfs import Sysfs


def test_the_memory_walk_orders_blocks_by_number_with_node_and_zone(tmp_path: Path) -> None:
    """memory10 comes after memory2; other entries are skipped; the zone counts when online."""
    base = tmp_path / "devices/system/memory"
    for n, state, zones, node in [
        (10, "online", "Movable", 1),
        (2, "offline", "Normal Movable", 0),
        (1, "online", "Normal", None),
    ]:
        (base / f"memory{n}").mkdir(parents=True)
        (base / f"memory{n}/state").write_text(state + "\n")
        (base / f"memory{n}/valid_zones").write_text(zones + "\n")
        if node is not None:
            (base / f"memory{n}/node{node}").symlink_to(tmp_path)
    (base / "memory3").mkdir()  # no state: being added, or not a block
    (base / "memoryX").mkdir()
    (base / "auto_online_blocks").write_text("offline\n")
    sysfs = Sysfs(tmp_path)
    assert walk(sysfs, detail=True) == [
        Block(1, "online", None, ("Normal",)),
        Block(2, "offline", 0, ("Normal", "Movable")),
        Block(10, "online", 1, ("Movable",)),
    ]
    assert [b.zone for b in walk(sysfs, detail=True)] == ["Normal", None, "Movable"]
    assert walk(sysfs) == [Block(1, "online"), Block(2, "offline"), Block(10, "online")]
    assert blocks(sysfs) == {1: "online", 2: "offline", 10: "online"}
    assert blocks(sysfs, only=[10, 3, 7]) == {10: "online"}
    assert walk(Sysfs(tmp_path / "absent")) == []


def test_live_modules_are_those_with_an_initstate(tmp_path: Path) -> None:
    """Built-ins (no initstate) are not live; srcversion is None where sysfs has no file."""
    module = tmp_path / "module"
    for name, files in {
        "nvidia": {"initstate": "live", "srcversion": "ABCDEF0123456789"},
        "ms_exporter": {"initstate": "live"},
        "firmware_class": {},
    }.items():
        (module / name).mkdir(parents=True)
        for f, text in files.items():
            (module / name / f).write_text(text + "\n")
    expected = {"ms_exporter": None, "nvidia": "ABCDEF0123456789"}
    assert live_modules(Sysfs(tmp_path)) == expected
    assert LinuxKernel(tmp_path).loaded() == expected
    assert live_modules(Sysfs(tmp_path / "absent")) == {}

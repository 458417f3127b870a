"""The quarantine's own promises (``service.publish.quarantine``): its directory is private, a
drop it could not keep is not recorded as kept, and its record files are read strictly."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from service.config import Limits
from service.layout import Layout
from service.publish.quarantine import Record, put
from tests.service.conftest import HostTree


def a_drop(layout: Layout) -> Path:
    drop = layout.incoming / "bad"
    drop.mkdir(parents=True)
    (drop / "manifest.toml").write_text("junk")
    return drop


def test_the_quarantine_directory_is_made_private(host_tree: HostTree) -> None:
    """The quarantine directory ``put`` makes is mode 0700 whatever the umask (a rejected
    drop may hold what its container should not show the node's other users), and the drop
    is kept in it."""
    layout = host_tree()
    old = os.umask(0)
    try:
        record = put(layout, a_drop(layout), "b", ["why"], Limits())
    finally:
        os.umask(old)
    assert os.stat(layout.quarantine).st_mode & 0o7777 == 0o700
    assert record.kept and (layout.quarantine / "bad").is_dir()


def test_a_drop_the_quarantine_cannot_take_is_not_recorded_as_kept(
    host_tree: HostTree,
) -> None:
    """When the quarantine directory cannot be made (a file is in its place), the drop is
    removed, its record says it was not kept and measures nothing, and the failed move is
    logged as a warning naming the drop."""
    from structlog.testing import capture_logs

    layout = host_tree()
    layout.quarantine.write_text("in the way")
    drop = a_drop(layout)
    with capture_logs() as logs:
        record = put(layout, drop, "b", ["why"], Limits())
    assert not record.kept and record.size == 0
    assert not drop.exists()
    [failed] = [e for e in logs if e["event"] == "quarantine.move_failed"]
    assert (failed["drop"], failed["log_level"]) == ("bad", "warning")


def test_a_record_written_before_sizes_were_recorded_reads_as_size_zero() -> None:
    """A record file without ``size`` (older modstage) reads with size 0: nothing is counted
    against the quarantine's bytes for it."""
    doc = {"drop": "d", "bundle": None, "reasons": ["r"], "at": 1.0, "kept": False}
    assert Record.from_dict(doc).size == 0


def test_a_table_that_is_not_a_record_is_a_value_error() -> None:
    """A record file's table missing its fields, or of the wrong types, raises ValueError
    (the caller skips it) rather than giving a record."""
    for doc in ({"drop": "d"}, {"drop": 1, "bundle": None, "reasons": [], "at": 1.0}):
        with pytest.raises(ValueError, match="not a quarantine record"):
            Record.from_dict(doc)


def test_a_drop_that_cannot_be_measured_keeps_its_record_not_its_contents(
    host_tree: HostTree,
) -> None:
    """A rejected drop deeper than the 32 levels the quarantine measures counts as more than
    the quarantine's byte limit: even into an empty quarantine its contents are removed at
    once and its record stays, saying so (an unmeasured drop could hold any size)."""
    from service.publish.quarantine import records
    from stager.schema.paths import drop_name

    layout = host_tree()
    drop = layout.incoming / drop_name("b", 1, "ab")
    deep = drop.joinpath(*["d"] * 40)
    deep.mkdir(parents=True)
    (deep / "file").write_bytes(b"x")
    put(layout, drop, "b", ["why"], Limits())
    assert not drop.exists()
    assert not (layout.quarantine / drop.name).exists()
    [record] = records(layout)
    assert (record.drop, record.kept, record.size) == (drop.name, False, 0)
    assert record.reasons[-1] == "contents removed: over the quarantine's size limit"


def test_a_record_that_cannot_be_written_is_logged_and_the_drop_kept(
    host_tree: HostTree,
) -> None:
    """When the record cannot be written (a directory stands at its name), ``put`` does not
    raise: the error is logged naming the drop, the drop is in the quarantine, and the
    quarantining itself is logged (kept, left nowhere)."""
    from structlog.testing import capture_logs

    from stager.schema.paths import drop_name

    layout = host_tree()
    drop = layout.incoming / drop_name("b", 1, "ab")
    drop.mkdir(parents=True)
    (layout.quarantine / f"{drop.name}.json").mkdir(parents=True)
    with capture_logs() as logs:
        record = put(layout, drop, "b", ["why"], Limits())
    assert record.kept and (layout.quarantine / drop.name).is_dir()
    events = {e["event"]: e for e in logs}
    assert events["quarantine.unwritable"]["drop"] == drop.name
    assert events["quarantine.unwritable"]["log_level"] == "error"
    done = events["drop.quarantined"]
    assert (done["drop"], done["kept"], done["left"], done["log_level"]) == (
        drop.name, True, None, "info"
    )  # fmt: skip


def test_a_drop_moved_in_without_its_record_is_removed_at_the_next_put(
    host_tree: HostTree,
) -> None:
    """A drop moved into the quarantine whose record was never written (the intake was
    killed in between) counts against no bound and is removed when the next drop is put
    there; an entry whose name is not a drop's (an admin's) is left alone, and the new
    drop is kept."""
    from stager.schema.paths import drop_name

    layout = host_tree()
    layout.quarantine.mkdir(parents=True)
    orphan = layout.quarantine / drop_name("b", 1, "aa")
    orphan.mkdir()
    (orphan / "manifest.toml").write_text("moved, never recorded")
    (layout.quarantine / "notes").mkdir()
    drop = layout.incoming / drop_name("b", 2, "bb")
    drop.mkdir(parents=True)
    record = put(layout, drop, "b", ["why"], Limits())
    assert not orphan.exists()
    assert (layout.quarantine / "notes").is_dir()
    assert record.kept and (layout.quarantine / drop.name).is_dir()


@pytest.mark.parametrize(("spare", "kept"), [(0, True), (-1, False)])
def test_a_drop_exactly_at_the_byte_limit_is_kept(
    host_tree: HostTree, spare: int, kept: bool
) -> None:
    """The quarantine keeps drops up to ``quarantine_bytes`` inclusive: a drop measuring
    exactly the limit keeps its contents, one byte less of limit removes them (the record
    stays)."""
    from service.dropfs import tree_size
    from stager.schema.paths import drop_name

    layout = host_tree()
    drop = layout.incoming / drop_name("b", 1, "ab")
    drop.mkdir(parents=True)
    (drop / "manifest.toml").write_bytes(b"x" * 5000)
    size = tree_size(layout.incoming, drop.name, max_entries=100)
    assert size is not None and size >= 5000
    put(layout, drop, "b", ["why"], Limits(quarantine_bytes=size + spare))
    assert (layout.quarantine / drop.name).exists() == kept


def test_a_quarantined_drop_that_cannot_be_removed_keeps_its_record(
    host_tree: HostTree,
) -> None:
    """A drop in the quarantine that must go (too many entries to measure counts as over
    the byte limit) but cannot be removed (more entries than removal may walk) is logged as
    unremovable, and its record is written all the same, as it was: nothing the quarantine
    holds is left without a record."""
    from structlog.testing import capture_logs

    from service.publish.quarantine import records
    from stager.schema.paths import drop_name

    layout = host_tree()
    drop = layout.incoming / drop_name("b", 1, "ab")
    drop.mkdir(parents=True)
    for i in range(12):
        (drop / f"f{i}").write_bytes(b"x")
    with capture_logs() as logs:
        put(layout, drop, "b", ["why"], Limits(max_tree_entries=4))
    assert (layout.quarantine / drop.name).is_dir()
    [record] = records(layout)
    assert (record.drop, record.kept, record.reasons) == (drop.name, True, ("why",))
    [failed] = [e for e in logs if e["event"] == "quarantine.unremovable"]
    assert (failed["drop"], failed["log_level"]) == (drop.name, "error")

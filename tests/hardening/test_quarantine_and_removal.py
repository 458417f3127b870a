"""Hostile drops: what a container leaves behind is removed without following it, or kept
in a bounded quarantine.

Removal is iterative and follows nothing (deep chains, unlisted trees); a drop that cannot be
removed goes to the quarantine once; the quarantine is bounded in bytes and drops, status lists
it without rendering a drop's markup, and a drop on another file system is copied into it
reading nothing through a hard link and writing over nothing.
"""

from __future__ import annotations

import io
import os
from collections.abc import Iterator
from pathlib import Path

import pytest
from structlog.testing import capture_logs

from service.config import Config, Limits
from service.dropfs import MAX_OPEN_DEPTH, RemoveError, remove_tree
from service.layout import Layout
from service.publish import quarantine
from service.status.collect import collect
from service.status.view import lines, render_rich
from stager.schema.paths import MANIFEST_NAME
from tests.hardening.conftest import chain, make_intake, stage_drop
from tests.hardening.watch import AccessWatch

M = "ms_exporter"


def _good(host: Layout, kernel: str, signed: dict[str, Path], bundle: str = "good") -> Path:
    return stage_drop(host, kernel, [signed[M]], bundle=bundle)


def test_remove_tree_is_iterative_and_follows_nothing(tmp_path: Path) -> None:
    """A 3,000-deep tree with symlinks to outside is removed; the symlinks' targets survive."""
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "canary").write_text("keep")
    top = tmp_path / "drop"
    top.mkdir()
    chain(top, 3000)
    (top / "out").symlink_to(outside)
    removed = remove_tree(tmp_path, "drop", max_entries=100_000)
    assert not os.path.lexists(top)
    assert removed == 3000 * 3 + 2
    assert (outside / "canary").read_text() == "keep"
    assert MAX_OPEN_DEPTH < 3000  # so the hoisting path was exercised


def test_remove_tree_bounded_by_entries(tmp_path: Path) -> None:
    """Past ``max_entries`` the removal stops with an error naming the tree, not a hang."""
    top = tmp_path / "drop"
    top.mkdir()
    for i in range(50):
        (top / f"f{i}").touch()
    with pytest.raises(RemoveError, match="more than 10 entries"):
        remove_tree(tmp_path, "drop", max_entries=10)


def test_manifest_directory_with_deep_chain_is_rejected_and_others_taken(
    host: Layout, kernel: str, signed: dict[str, Path]
) -> None:
    """Found 1: ``manifest.toml/`` holding a 1,500-deep chain crashed every intake (RecursionError).

    Now the drop is rejected, moved to the quarantine, and another bundle's drop in the
    same run is taken in.
    """
    bad = _good(host, kernel, signed, bundle="evil")
    (bad / MANIFEST_NAME).unlink()
    (bad / MANIFEST_NAME).mkdir()
    chain(bad / MANIFEST_NAME, 1500, extra=False)
    good = _good(host, kernel, signed)
    outcomes = {o.bundle: o for o in make_intake(host).run()}
    assert outcomes["good"].accepted
    assert not outcomes["evil"].accepted and not outcomes["evil"].deferred
    assert "is a directory, not a regular file" in outcomes["evil"].reasons[0]
    assert not os.path.lexists(bad) and not os.path.lexists(good)
    [record] = quarantine.records(host)
    assert record.drop == bad.name and record.bundle == "evil"
    assert make_intake(host).run() == []  # nothing left to crash the next start


def test_valid_drop_with_unlisted_deep_chain_is_removed_completely(
    host: Layout, kernel: str, signed: dict[str, Path]
) -> None:
    """Found 1: a valid drop with an unlisted deep chain was taken in, then crashed removal."""
    drop = _good(host, kernel, signed)
    (drop / "junk").mkdir()
    chain(drop / "junk", 2000)
    [outcome] = make_intake(host).run()
    assert outcome.accepted, outcome.reasons
    assert not os.path.lexists(drop)
    assert quarantine.records(host) == []


def test_unremovable_drop_goes_to_quarantine_once(
    host: Layout, kernel: str, signed: dict[str, Path]
) -> None:
    """A drop taken in that resists removal (over the entry limit) is quarantined, once."""
    drop = _good(host, kernel, signed)
    for i in range(40):
        (drop / f"junk{i}").touch()
    config = Config(limits=Limits(max_tree_entries=10))
    [outcome] = make_intake(host, config).run()
    assert outcome.accepted
    assert not os.path.lexists(drop)
    [record] = quarantine.records(host)
    assert record.kept and "could not be removed" in record.reasons[0]


def test_quarantine_is_bounded_in_bytes(host: Layout, kernel: str, signed: dict[str, Path]) -> None:
    """Quarantined drops over the byte budget lose their contents, newest kept, records stay."""
    config = Config(limits=Limits(quarantine_bytes=600 << 10, quarantine_drops=4))
    for i in range(6):
        drop = _good(host, kernel, signed, bundle=f"b{i}")
        (drop / "modules" / f"{M}.ko").write_bytes(os.urandom(256 << 10))
        make_intake(host, config).run()
    records = quarantine.records(host)
    assert [r.bundle for r in records] == ["b2", "b3", "b4", "b5"]
    assert [r.kept for r in records] == [False, False, True, True]
    assert sorted(p.name for p in host.quarantine.iterdir() if p.is_dir()) == sorted(
        r.drop for r in records if r.kept
    )


def test_status_lists_the_quarantine_and_never_renders_drop_markup(
    host: Layout, kernel: str, signed: dict[str, Path]
) -> None:
    """Found 8: a key "[/]" crashed the rich view (MarkupError); status lists
    the quarantined drops with their reasons."""
    drop = _good(host, kernel, signed)
    data = (drop / MANIFEST_NAME).read_text()
    (drop / MANIFEST_NAME).unlink()
    (drop / MANIFEST_NAME).write_text(data + '"[/]" = 1\n"[bold]x" = 2\n')
    make_intake(host).run()
    doc = collect(host)
    [q] = doc.quarantine
    assert q.drop == drop.name and "[/]: unknown key" in q.reasons[0]
    plain = "\n".join(lines(doc))
    assert f"quarantined {drop.name} (kept" in plain
    out = io.StringIO()
    render_rich(doc, out)
    assert "[/]" in out.getvalue()


@pytest.fixture
def incoming_on_tmpfs(host: Layout) -> Iterator[Layout]:
    """``incoming/`` on its own tmpfs, as the operator's /run/nvidia directory is: a rename
    from there into the quarantine under /var fails with EXDEV."""
    import subprocess

    subprocess.run(["mount", "-t", "tmpfs", "tmpfs", str(host.incoming)], check=True)
    try:
        yield host
    finally:
        subprocess.run(["umount", "-l", str(host.incoming)], check=True)


def test_a_drop_on_another_file_system_is_copied_into_the_quarantine(
    incoming_on_tmpfs: Layout, kernel: str, signed: dict[str, Path]
) -> None:
    """A rejected drop that cannot be renamed into the quarantine (EXDEV) is copied there:
    its regular files with their bytes, never a FIFO (not even opened: inotify on it) or
    what a symlink points at; the original is removed from the incoming directory."""
    host = incoming_on_tmpfs
    drop = _good(host, kernel, signed, bundle="cross")
    junk = os.urandom(4096)
    (drop / "modules" / f"{M}.ko").write_bytes(junk)
    os.mkfifo(drop / "modules" / "fifo")
    (drop / "modules" / "link").symlink_to("/etc/passwd")
    nodes = AccessWatch([drop / "modules" / "fifo"])
    try:
        make_intake(host, Config()).run()
        opened = nodes.events()
    finally:
        nodes.close()
    assert opened == [], f"the FIFO was opened: {opened}"
    [record] = quarantine.records(host)
    assert record.kept and record.bundle == "cross" and record.left is None
    kept = host.quarantine / record.drop
    assert (kept / "modules" / f"{M}.ko").read_bytes() == junk
    assert not os.path.lexists(kept / "modules" / "fifo")
    assert not os.path.lexists(kept / "modules" / "link")
    assert not drop.exists()


def test_a_cross_file_system_copy_reads_nothing_through_a_hard_link(
    incoming_on_tmpfs: Layout, kernel: str, signed: dict[str, Path]
) -> None:
    """A rejected drop on another file system holding a hard link to a file beside it on
    that file system (not in the drop) is copied into the quarantine without that file
    being opened or read, as intake refuses such a file ("has 2 hard links")."""
    host = incoming_on_tmpfs
    beside = host.incoming / "driver-state"  # not a drop: the host's, on the same tmpfs
    beside.write_bytes(b"not the container's")
    drop = _good(host, kernel, signed, bundle="cross")
    (drop / "modules" / f"{M}.ko").write_bytes(b"junk")
    os.link(beside, drop / "modules" / "extra")
    watch = AccessWatch([beside])
    try:
        make_intake(host, Config()).run()
        seen = watch.events()
    finally:
        watch.close()
    [record] = quarantine.records(host)
    assert record.kept and not drop.exists()
    assert seen == [], f"opened outside the drop: {seen}"
    assert not os.path.lexists(host.quarantine / record.drop / "modules" / "extra")


def test_a_cross_file_system_copy_over_the_bound_keeps_only_the_record(
    incoming_on_tmpfs: Layout, kernel: str, signed: dict[str, Path]
) -> None:
    """A copy that would pass ``quarantine_bytes`` is removed again: the record stays (not
    kept), no partial copy is left, the drop is gone from the incoming directory, and the
    failed copy is logged as a warning naming the drop."""

    host = incoming_on_tmpfs
    drop = _good(host, kernel, signed, bundle="big")
    (drop / "modules" / f"{M}.ko").write_bytes(os.urandom(64 << 10))
    with capture_logs() as logs:
        make_intake(host, Config(limits=Limits(quarantine_bytes=16 << 10))).run()
    [failed] = [e for e in logs if e["event"] == "quarantine.copy_failed"]
    assert (failed["drop"], failed["log_level"]) == (drop.name, "warning")
    [record] = quarantine.records(host)
    assert not record.kept
    assert not (host.quarantine / record.drop).exists()
    assert not drop.exists()


def test_a_cross_file_system_copy_never_writes_over_the_quarantine(
    incoming_on_tmpfs: Layout, kernel: str, signed: dict[str, Path]
) -> None:
    """A rejected drop on another file system whose name the quarantine already holds is
    not copied into or over that entry: the entry keeps exactly what it held, the drop's
    record says it was not kept, and the drop is removed from the incoming directory."""
    host = incoming_on_tmpfs
    drop = _good(host, kernel, signed, bundle="cross")
    (drop / "modules" / f"{M}.ko").write_bytes(b"junk")
    there = host.quarantine / drop.name
    there.mkdir(parents=True)
    (there / "earlier").write_bytes(b"held before")
    make_intake(host, Config()).run()
    [record] = quarantine.records(host)
    assert record.drop == drop.name and not record.kept
    assert os.listdir(there) == ["earlier"]
    assert (there / "earlier").read_bytes() == b"held before"
    assert not drop.exists()

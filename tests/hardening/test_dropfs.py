"""The drop reader's primitives, one property each: ``service.beneath`` and
``service.dropfs`` on small trees under ``tmp_path``.

The hostile-drop catalogue proves these end to end through intake; here each is pinned
down in milliseconds, so ``bench/mutate`` can run them for every mutant of the two
modules (docs/reliability.md, "Mutation testing"). No keys, no modules, no daemon.
"""

from __future__ import annotations

import errno
import os
import re
import stat
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from service.beneath import open_beneath, open_regular
from service.dropfs import (
    MAX_OPEN_DEPTH,
    RemoveError,
    _copy_file,
    check_regular,
    copy_tree,
    open_dir,
    open_file,
    read_small,
    remove_tree,
    tree_size,
)
from service.errors import DropError
from tests.hardening.conftest import chain
from tests.hardening.watch import AccessWatch

NOTDIR = "a directory on its path is not a directory (or is a symbolic link)"


def _accept(st: os.stat_result) -> None:
    """A check that accepts any inode."""


def _open_fds() -> set[str]:
    return set(os.listdir("/proc/self/fd"))


@pytest.fixture
def tree(tmp_path: Path) -> Path:
    """``drop/`` with ``modules/a.ko`` (b"module"), a FIFO, a device node, a symlink out,
    a symlinked directory, a hard link to a file outside, and ``outside/secret``."""
    drop = tmp_path / "drop"
    (drop / "modules").mkdir(parents=True)
    (drop / "modules/a.ko").write_bytes(b"module")
    (tmp_path / "outside").mkdir()
    (tmp_path / "outside/secret").write_bytes(b"secret")
    os.mkfifo(drop / "fifo")
    os.mknod(drop / "zero", stat.S_IFCHR | 0o600, os.makedev(1, 5))
    (drop / "link").symlink_to(tmp_path / "outside/secret")
    (drop / "linkdir").symlink_to(tmp_path / "outside")
    os.link(tmp_path / "outside/secret", drop / "hard")
    return drop


@pytest.fixture
def drop_fd(tree: Path) -> Iterator[int]:
    """The drop directory, opened."""
    fd = os.open(tree, os.O_RDONLY | os.O_DIRECTORY)
    yield fd
    os.close(fd)


@pytest.fixture
def watched(tree: Path) -> Iterator[AccessWatch]:
    """inotify on the FIFO, the device node and the file outside (opens and reads)."""
    watch = AccessWatch([tree / "fifo", tree / "zero", tree.parent / "outside/secret"])
    yield watch
    watch.close()


# service.beneath ---------------------------------------------------------------------


def test_open_beneath_reads_the_file_through_a_blocking_private_descriptor(drop_fd: int) -> None:
    """A regular file is opened for reading; the descriptor is blocking and not inherited
    by children; the walk leaves no other descriptor open."""
    before = _open_fds()
    fd = open_beneath(drop_fd, "modules/a.ko", _accept)
    try:
        assert os.read(fd, 100) == b"module"
        assert os.get_blocking(fd) and not os.get_inheritable(fd)
        assert _open_fds() - before == {str(fd)}
    finally:
        os.close(fd)


def test_open_beneath_checks_the_inode_before_opening_it(
    drop_fd: int, watched: AccessWatch
) -> None:
    """``check`` gets the very inode's stat (a FIFO, a device: not followed, not opened);
    when it refuses, nothing was opened and no descriptor is left."""
    seen: list[int] = []

    def refuse(st: os.stat_result) -> None:
        seen.append(stat.S_IFMT(st.st_mode))
        raise OSError(errno.EINVAL, "refused")

    before = _open_fds()
    for name in ("fifo", "zero", "modules/a.ko"):
        with pytest.raises(OSError, match="refused"):
            open_beneath(drop_fd, name, refuse)
    assert seen == [stat.S_IFIFO, stat.S_IFCHR, stat.S_IFREG]
    assert watched.events() == []
    assert _open_fds() == before


def test_open_beneath_sees_a_final_symlink_itself(drop_fd: int, watched: AccessWatch) -> None:
    """A final symlink is not followed: ``check`` sees a link (its target's stat would pass
    for a regular file), and even an accepting check gets no descriptor of the target."""
    seen: list[int] = []
    with pytest.raises(OSError) as err:
        open_beneath(drop_fd, "link", lambda st: seen.append(stat.S_IFMT(st.st_mode)))
    assert seen == [stat.S_IFLNK] and err.value.errno == errno.ELOOP
    assert watched.events() == []


def test_open_beneath_refuses_a_symlinked_directory(drop_fd: int, watched: AccessWatch) -> None:
    """A directory on the path that is a symlink stops the walk (ENOTDIR), whatever it names."""
    with pytest.raises(OSError) as err:
        open_beneath(drop_fd, "linkdir/secret", _accept)
    assert err.value.errno == errno.ENOTDIR
    assert watched.events() == []


@pytest.mark.parametrize("relative", ["", ".", "..", "modules/../modules/a.ko", "modules//a.ko"])
def test_open_beneath_refuses_unnormalized_paths(drop_fd: int, relative: str) -> None:
    """Empty, ``.`` and ``..`` components are refused before anything is opened (EINVAL)."""
    before = _open_fds()
    with pytest.raises(OSError) as err:
        open_beneath(drop_fd, relative, _accept)
    assert err.value.errno == errno.EINVAL
    assert _open_fds() == before


def test_open_beneath_accepting_a_fifo_does_not_block(drop_fd: int) -> None:
    """A check that lets a FIFO through gets a descriptor at once (the reopen is
    non-blocking, so a FIFO without a writer cannot stall the caller), made blocking after."""
    fd = open_beneath(drop_fd, "fifo", _accept)
    try:
        assert os.get_blocking(fd)
    finally:
        os.close(fd)


def test_open_beneath_reopens_the_inode_it_checked(tree: Path, drop_fd: int) -> None:
    """A file swapped in after the check is not the one read: the reopen goes through the
    checked descriptor, not the name."""
    (tree / "other").write_bytes(b"swapped")

    def swap(st: os.stat_result) -> None:
        os.rename(tree / "other", tree / "modules/a.ko")

    fd = open_beneath(drop_fd, "modules/a.ko", swap)
    try:
        assert os.read(fd, 100) == b"module"
    finally:
        os.close(fd)


def test_open_regular_without_follow_refuses_links_and_fifos(
    tree: Path, watched: AccessWatch
) -> None:
    """``open_regular(follow=False)`` (``modstage verify`` on a drop): a final symlink is
    ELOOP, a FIFO EINVAL, neither opened; a regular file reads and the stream is blocking."""
    for name, code in (("link", errno.ELOOP), ("fifo", errno.EINVAL), ("zero", errno.EINVAL)):
        with pytest.raises(OSError) as err:
            open_regular(tree, name, follow=False)
        assert err.value.errno == code, name
    assert watched.events() == []
    before = _open_fds()
    with open_regular(tree, "modules/a.ko", follow=False) as f:
        assert f.read() == b"module" and os.get_blocking(f.fileno())
        assert _open_fds() - before == {str(f.fileno())}


def test_open_regular_with_follow_reads_through_links_but_only_regular_files(
    tree: Path,
) -> None:
    """``follow=True`` (a path an admin gave): symlinks are followed, a FIFO is still
    refused (EINVAL) without blocking, and no descriptor is left behind."""
    with open_regular(tree, "link", follow=True) as f:
        assert f.read() == b"secret" and os.get_blocking(f.fileno())
    before = _open_fds()
    with pytest.raises(OSError) as err:
        open_regular(tree, "fifo", follow=True)
    assert err.value.errno == errno.EINVAL
    assert _open_fds() == before


def test_opening_a_terminal_never_makes_it_the_controlling_one() -> None:
    """A terminal device reached through a path (``follow=True`` opens before it checks) is
    refused, and a process without a controlling terminal (the daemon) does not get it as
    one (``O_NOCTTY``)."""
    leader, terminal = os.openpty()
    name = os.ttyname(terminal)
    pid = os.fork()
    if pid == 0:  # a session of its own: no controlling terminal, as a daemon
        code = 1
        try:
            os.setsid()
            try:
                open_regular(Path(name).parent, Path(name).name, follow=True)
            except OSError as exc:
                code = 2 if exc.errno != errno.EINVAL else 0
            try:
                os.close(os.open("/dev/tty", os.O_RDONLY))
                code = 3  # it has a controlling terminal now
            except OSError:
                pass
        finally:
            os._exit(code)
    _pid, status = os.waitpid(pid, 0)
    os.close(leader)
    os.close(terminal)
    assert os.waitstatus_to_exitcode(status) == 0


# service.dropfs: reading -------------------------------------------------------


def test_open_dir_refuses_a_symlink_a_file_and_nothing(tree: Path) -> None:
    """The drop directory itself: opened if it is one; a symlink, a file or nothing is a
    DropError saying which."""
    fd = open_dir(tree)
    os.close(fd)
    for name, why in (
        ("linkdir", "is a symbolic link"),
        ("modules/a.ko", NOTDIR),
        ("missing", "does not exist"),
    ):
        with pytest.raises(DropError) as err:
            open_dir(tree / name)
        assert err.value.reason == why, name


@pytest.mark.parametrize(
    ("name", "why"),
    [
        ("fifo", "is a FIFO, not a regular file"),
        ("zero", "is a device node, not a regular file"),
        ("modules", "is a directory, not a regular file"),
        ("link", "is a symbolic link"),
        ("hard", "has 2 hard links (a drop file must have one)"),
        ("linkdir/secret", NOTDIR),
        ("missing", "does not exist"),
        ("modules/a.ko/x", NOTDIR),
    ],
)
def test_open_file_refuses_with_its_reason(
    tree: Path, drop_fd: int, watched: AccessWatch, name: str, why: str
) -> None:
    """Anything but a singly linked regular file is refused naming the file and why, and
    nothing (not the FIFO, the device, nor the file outside) is opened."""
    with pytest.raises(DropError) as err:
        open_file(drop_fd, name, display=tree, max_bytes=1 << 20)
    assert (err.value.path, err.value.reason) == (str(tree / name), why)
    assert watched.events() == []


def test_open_file_reports_other_errors_in_plain_words(tree: Path, drop_fd: int) -> None:
    """An errno without a reason of its own is shown as its text (a name too long)."""
    with pytest.raises(DropError) as err:
        open_file(drop_fd, "x" * 300, display=tree, max_bytes=1)
    assert err.value.reason == os.strerror(errno.ENAMETOOLONG)


def test_socket_is_named_a_socket(tmp_path: Path) -> None:
    """A socket is refused as a socket, a block device as a device node."""
    os.mknod(tmp_path / "sock", stat.S_IFSOCK | 0o600)
    os.mknod(tmp_path / "blk", stat.S_IFBLK | 0o600, os.makedev(7, 0))
    for name, why in (("sock", "is a socket"), ("blk", "is a device node")):
        with pytest.raises(DropError) as err:
            check_regular(os.lstat(tmp_path / name), tmp_path / name, 1)
        assert err.value.reason == f"{why}, not a regular file"


def test_the_size_limit_is_inclusive_and_names_itself(tree: Path, drop_fd: int) -> None:
    """A file of exactly ``max_bytes`` passes; one byte more is refused with its size and
    the limit, worded as the caller names it."""
    os.close(open_file(drop_fd, "modules/a.ko", display=tree, max_bytes=6))
    with pytest.raises(DropError) as err:
        open_file(drop_fd, "modules/a.ko", display=tree, max_bytes=5)
    assert err.value.reason == "is 6 bytes, over the limit of 5"
    with pytest.raises(DropError) as err:
        open_file(drop_fd, "modules/a.ko", display=tree, max_bytes=5, limit="the 5 bytes left")
    assert err.value.reason == "is 6 bytes, over the 5 bytes left"


def test_read_small_reads_all_and_refuses_a_file_that_grew(tree: Path, drop_fd: int) -> None:
    """The whole file, up to ``max_bytes`` inclusive; a file whose size said it fit but whose
    content is longer (procfs files say 0) is refused, not truncated."""
    assert read_small(drop_fd, "modules/a.ko", display=tree, max_bytes=6) == b"module"
    before = _open_fds()
    proc = os.open("/proc/self", os.O_RDONLY | os.O_DIRECTORY)
    try:
        with pytest.raises(DropError) as err:
            read_small(proc, "status", display=Path("/proc/self"), max_bytes=16)
    finally:
        os.close(proc)
    assert err.value.reason == "grew beyond the limit of 16 bytes"
    assert _open_fds() == before


# service.dropfs: removing, measuring, copying ----------------------------------


def _entries(top: Path) -> int:
    return sum(len(dirs) + len(files) for _d, dirs, files in os.walk(top))


def test_remove_tree_removes_everything_and_counts_it(tree: Path) -> None:
    """Every entry below and the directory itself go; the count is all of them; what links
    point at (the file outside, the hard-linked inode) is untouched."""
    expected = _entries(tree) + 1
    before = _open_fds()
    assert remove_tree(tree.parent, tree.name, max_entries=100) == expected
    assert _open_fds() == before
    assert not os.path.lexists(tree)
    assert (tree.parent / "outside/secret").read_bytes() == b"secret"
    assert (tree.parent / "outside/secret").stat().st_nlink == 1


def test_remove_tree_of_a_file_or_nothing(tmp_path: Path) -> None:
    """A plain file is unlinked (nothing to count below it); a missing name is nothing."""
    (tmp_path / "f").write_bytes(b"x")
    assert remove_tree(tmp_path, "f", max_entries=1) == 0
    assert not os.path.lexists(tmp_path / "f")
    assert remove_tree(tmp_path, "f", max_entries=1) == 0
    (tmp_path / "l").symlink_to(tmp_path)
    assert remove_tree(tmp_path, "l", max_entries=1) == 0
    assert tmp_path.is_dir() and not os.path.lexists(tmp_path / "l")


def test_remove_tree_deeper_than_the_open_limit(tmp_path: Path) -> None:
    """A chain deeper than MAX_OPEN_DEPTH (each level a file and a symlink out) is removed
    completely and counted; nothing it links to is followed."""
    (tmp_path / "t").mkdir()
    depth = MAX_OPEN_DEPTH * 3
    chain(tmp_path / "t", depth)
    assert remove_tree(tmp_path, "t", max_entries=10_000) == depth * 3 + 1
    assert not os.path.lexists(tmp_path / "t") and Path("/etc/passwd").is_file()


def test_remove_tree_entry_limit_is_inclusive(tmp_path: Path) -> None:
    """``max_entries`` entries below may be removed; one more is a RemoveError naming the
    tree, with the directory left."""
    for n, ok in ((10, True), (11, False)):
        top = tmp_path / f"t{n}"
        top.mkdir()
        for i in range(n):
            (top / f"f{i}").touch()
        if ok:
            assert remove_tree(tmp_path, top.name, max_entries=10) == n + 1
        else:
            with pytest.raises(RemoveError, match=f"{top}: more than 10 entries"):
                remove_tree(tmp_path, top.name, max_entries=10)
            assert top.is_dir()


def test_remove_tree_ticks_as_it_goes(tmp_path: Path) -> None:
    """``tick`` (the watchdog) is called for every batch of entries removed: a large flat
    directory, in batches of 4,096, and every subdirectory's files."""
    top = tmp_path / "t"
    top.mkdir()
    for i in range(5000):
        (top / f"f{i}").touch()
    for d in range(3):
        (top / f"d{d}").mkdir()
        (top / f"d{d}" / "f").touch()
    ticks: list[None] = []
    remove_tree(tmp_path, "t", max_entries=10_000, tick=lambda: ticks.append(None))
    assert len(ticks) >= 5


def test_remove_tree_reports_what_it_cannot_remove(tmp_path: Path) -> None:
    """A parent that is not a directory is a RemoveError naming the path and why."""
    (tmp_path / "f").write_bytes(b"x")
    with pytest.raises(RemoveError, match=re.escape(f"{tmp_path / 'f'}: {NOTDIR}")):
        remove_tree(tmp_path / "f", "x", max_entries=1)


def test_remove_tree_of_a_directory_larger_than_a_batch(tmp_path: Path) -> None:
    """A flat directory of more entries than one batch (4,096) is emptied batch after
    batch and removed."""
    top = tmp_path / "t"
    top.mkdir()
    for i in range(5000):
        (top / f"f{i}").touch()
    assert remove_tree(tmp_path, "t", max_entries=10_000) == 5001
    assert not os.path.lexists(top)


def test_remove_tree_holds_at_most_max_open_depth_directories(tmp_path: Path) -> None:
    """However deep the tree, at most 32 of its directories are open at once (deeper ones
    are hoisted), and none is left open, whether the removal succeeds or stops."""
    (tmp_path / "t").mkdir()
    chain(tmp_path / "t", 100)
    before = len(_open_fds())
    peak: list[int] = []
    remove_tree(
        tmp_path, "t", max_entries=10_000, tick=lambda: peak.append(len(_open_fds()) - before)
    )
    assert MAX_OPEN_DEPTH == 32 and 0 < max(peak) <= 32 + 1  # + the parent's descriptor
    assert len(_open_fds()) == before
    (tmp_path / "u").mkdir()
    chain(tmp_path / "u", 50)
    with pytest.raises(RemoveError, match="more than 60 entries"):
        remove_tree(tmp_path, "u", max_entries=60)
    assert len(_open_fds()) == before


def test_remove_tree_stops_at_a_mount_point(
    tmp_path: Path, tmpfs: Callable[[Path, str], Path]
) -> None:
    """A mount point cannot be removed: a RemoveError naming it (EBUSY), whether it is the
    tree itself or a directory below it; what is mounted there is emptied."""
    tmpfs(tmp_path / "top", "1m")
    (tmp_path / "top/f").touch()
    with pytest.raises(RemoveError) as err:
        remove_tree(tmp_path, "top", max_entries=100)
    assert err.value.errno == errno.EBUSY and str(tmp_path / "top") in str(err.value)
    assert os.listdir(tmp_path / "top") == []
    (tmp_path / "outer/inner").mkdir(parents=True)
    tmpfs(tmp_path / "outer/inner", "1m")
    with pytest.raises(RemoveError) as err:
        remove_tree(tmp_path, "outer", max_entries=100)
    assert err.value.errno == errno.EBUSY


def _blocks(*paths: Path) -> int:
    return sum(os.lstat(p).st_blocks * 512 for p in paths)


def _bushy(top: Path) -> Path:
    """Directories beside files at three levels, so no walk order ends on a leaf."""
    for a in "abc":
        for b in "xyz":
            (top / a / b).mkdir(parents=True)
            (top / a / b / "f").write_bytes(b"x" * 5000)
        (top / a / "g").write_bytes(b"y" * 100)
        (top / f"h{a}").write_bytes(b"z" * 10)
    return top


def test_tree_size_counts_every_entry_and_follows_nothing(tree: Path) -> None:
    """Bytes allocated to every entry below (links themselves, not their targets); a
    plain file or a symlink is its own size; nothing there is None; no descriptor left."""
    _bushy(tree / "bushy")
    below = [Path(d) / n for d, dirs, files in os.walk(tree) for n in dirs + files]
    before = _open_fds()
    assert tree_size(tree.parent, tree.name, max_entries=100) == _blocks(*below)
    assert _open_fds() == before
    assert tree_size(tree, "linkdir", max_entries=100) == _blocks(tree / "linkdir")
    assert tree_size(tree, "modules", max_entries=1) == _blocks(tree / "modules/a.ko")
    assert tree_size(tree / "modules", "a.ko", max_entries=0) == _blocks(tree / "modules/a.ko")
    assert tree_size(tree, "missing", max_entries=100) is None


def test_tree_size_gives_up_past_its_bounds(tmp_path: Path) -> None:
    """Deeper than MAX_OPEN_DEPTH, or more than ``max_entries`` entries: None (unmeasured),
    with no descriptor left open."""
    (tmp_path / "deep").mkdir()
    chain(tmp_path / "deep", MAX_OPEN_DEPTH, extra=False)  # the top is one of the open ones
    before = _open_fds()
    assert tree_size(tmp_path, "deep", max_entries=1000) is None
    assert _open_fds() == before
    (tmp_path / "ok").mkdir()
    chain(tmp_path / "ok", MAX_OPEN_DEPTH - 1, extra=False)
    assert tree_size(tmp_path, "ok", max_entries=1000) is not None
    flat = tmp_path / "flat"
    flat.mkdir()
    for i in range(5):
        (flat / f"f{i}").touch()
    assert tree_size(tmp_path, "flat", max_entries=5) == 0
    assert tree_size(tmp_path, "flat", max_entries=4) is None


def test_copy_tree_copies_directories_and_regular_files_only(
    tree: Path, watched: AccessWatch
) -> None:
    """Directories (0700) and regular files (0600, their bytes) are copied; the FIFO, the
    device, the symlinks are left out and never opened; the bytes copied are returned."""
    os.unlink(tree / "hard")  # see the next test
    into = tree.parent / "copy"
    before = _open_fds()
    assert copy_tree(tree.parent, tree.name, into, max_entries=100, max_bytes=100) == 6
    assert _open_fds() == before
    assert watched.events() == []
    found = {str(p.relative_to(into)): p for p in into.rglob("*")}
    assert sorted(found) == ["modules", "modules/a.ko"]
    assert found["modules/a.ko"].read_bytes() == b"module"
    assert stat.S_IMODE(os.lstat(into).st_mode) == 0o700
    assert stat.S_IMODE(os.lstat(found["modules"]).st_mode) == 0o700
    assert stat.S_IMODE(os.lstat(found["modules/a.ko"]).st_mode) == 0o600


def test_copy_tree_does_not_read_through_a_hard_link(tree: Path, watched: AccessWatch) -> None:
    """A hard link in the drop to a file outside it is not copied, and that file is never
    opened: its inode is not the drop's (as intake refuses it: "has 2 hard links")."""
    into = tree.parent / "copy"
    copy_tree(tree.parent, tree.name, into, max_entries=100, max_bytes=100)
    assert watched.events() == []
    assert not os.path.lexists(into / "hard")


@pytest.mark.parametrize(
    ("make", "max_entries", "max_bytes"),
    [
        (lambda t: (t / "big").write_bytes(b"x" * 11), 100, 10),
        (lambda t: [(t / f"f{i}").write_bytes(b"x" * 6) for i in range(2)], 100, 11),
        (lambda t: [(t / f"f{i}").touch() for i in range(6)], 5, 100),
        (lambda t: chain(t, MAX_OPEN_DEPTH, extra=False), 1000, 100),
    ],
    ids=["bytes", "total-bytes", "entries", "depth"],
)
def test_copy_tree_gives_up_past_its_bounds(
    tmp_path: Path, make: Callable[[Path], object], max_entries: int, max_bytes: int
) -> None:
    """One byte (of one file or of all), one entry or one level too many: None (the caller
    removes the partial copy), with no descriptor left open."""
    (tmp_path / "src").mkdir()
    make(tmp_path / "src")
    into = tmp_path / "copy"
    before = _open_fds()
    assert copy_tree(tmp_path, "src", into, max_entries=max_entries, max_bytes=max_bytes) is None
    assert _open_fds() == before


def test_a_copied_file_is_checked_again_when_opened(tree: Path, watched: AccessWatch) -> None:
    """The copy opens each file as drop files are opened, checking the inode it opens: a
    FIFO swapped in after the walk looked at the name is refused (EINVAL), never opened."""
    into = tree.parent / "into"
    into.mkdir()
    src, dst = os.open(tree, os.O_RDONLY | os.O_DIRECTORY), os.open(into, os.O_RDONLY)
    try:
        with pytest.raises(OSError) as err:
            _copy_file(src, dst, "fifo", 100)
    finally:
        os.close(src)
        os.close(dst)
    assert err.value.errno == errno.EINVAL
    assert watched.events() == [] and os.listdir(into) == []


def test_a_copied_file_that_gained_a_link_is_refused_unread(
    tree: Path, watched: AccessWatch
) -> None:
    """A file given a second hard link after the walk saw one (a link to a file outside the
    drop) is refused by the copy's own check (EMLINK), before anything is read or created."""
    into = tree.parent / "into"
    into.mkdir()
    assert os.lstat(tree / "hard").st_nlink == 2
    src, dst = os.open(tree, os.O_RDONLY | os.O_DIRECTORY), os.open(into, os.O_RDONLY)
    try:
        with pytest.raises(OSError) as err:
            _copy_file(src, dst, "hard", 100)
    finally:
        os.close(src)
        os.close(dst)
    assert (err.value.errno, err.value.strerror) == (errno.EMLINK, "has 2 hard links")
    assert watched.events() == [] and os.listdir(into) == []


def test_copy_tree_keeps_the_layout(tmp_path: Path) -> None:
    """Every file lands in its own directory of the copy, with its bytes, at every level."""
    src = _bushy(tmp_path / "src")
    into = tmp_path / "copy"
    copied = copy_tree(tmp_path, "src", into, max_entries=100, max_bytes=1 << 20)
    assert copied == 9 * 5000 + 3 * 100 + 3 * 10

    def files(top: Path) -> dict[str, bytes]:
        return {str(p.relative_to(top)): p.read_bytes() for p in top.rglob("*") if p.is_file()}

    assert files(into) == files(src)


def test_copy_tree_within_its_bounds(tmp_path: Path) -> None:
    """Exactly ``max_bytes`` bytes and ``max_entries`` entries, one level less than the
    depth limit: copied."""
    src = tmp_path / "src"
    src.mkdir()
    (src / "f").write_bytes(b"x" * 10)
    chain(src, MAX_OPEN_DEPTH - 1, extra=False)
    entries = _entries(src)
    into = tmp_path / "copy"
    assert copy_tree(tmp_path, "src", into, max_entries=entries, max_bytes=10) == 10
    assert _entries(into) == entries

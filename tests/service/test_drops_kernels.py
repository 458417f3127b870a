"""Which complete drops a scan keeps: the newest of each bundle for each kernel."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

from service.bundles.statefile import load
from service.config import Config
from service.intake.drops import MAX_READ, Drops
from service.layout import Layout
from stager.drop import ModuleSpec, stage
from stager.schema.manifest import Manifest, ModuleEntry
from stager.schema.paths import MANIFEST_NAME, drop_name, parse_drop_name
from tests.service.fakes import make_intake

X, Y = "6.1.0-57-amd64", "6.12.95+deb13-amd64"  # the running kernel, the next one


def _drop(host: Layout, nanos: int, kernel: str, bundle: str = "nvidia") -> Path:
    """A complete drop named for time ``nanos``: a manifest only (a scan reads no more)."""
    drop = host.incoming / drop_name(bundle, nanos, f"{nanos:016x}")
    drop.mkdir(parents=True)
    m = Manifest(bundle, "1", kernel, (ModuleEntry("modules/nv.ko", "0" * 64),))
    (drop / MANIFEST_NAME).write_bytes(m.to_toml())
    return drop


def _scan(host: Layout) -> list[Path]:
    drops = Drops(host, Config())
    try:
        return drops.complete()
    finally:
        drops.empty_trash()


def test_a_newer_drop_supersedes_only_the_older_drops_for_its_kernel(host: Layout) -> None:
    """The pre-stage pod's drop for Y still waits when the driver pod's drop for X and then
    a newer one for X arrive: the scan keeps Y's and the newest X's, oldest first (the one
    staged last is taken in last), and removes the older X drop; other bundles' drops stay."""
    for_y, old_x, new_x = _drop(host, 1, Y), _drop(host, 2, X), _drop(host, 3, X)
    other = _drop(host, 4, X, bundle="mlnx")
    kept = _scan(host)
    assert sorted(kept) == sorted([for_y, new_x, other]) and not old_x.exists()
    assert [d for d in kept if d.name.startswith("nvidia.")] == [for_y, new_x]
    assert sorted(host.incoming.iterdir()) == sorted(kept)


def test_a_drop_whose_manifest_names_no_kernel_supersedes_none(host: Layout) -> None:
    """Older drops whose manifest cannot be read (garbage, a symlink to a real manifest for
    X, one naming another bundle than its name) are superseded by a newer drop for Y; a
    newest drop that cannot be read is kept (intake refuses it) and removes no drop that
    names a kernel."""
    garbage, linked, foreign = _drop(host, 1, X), _drop(host, 2, X), _drop(host, 3, X, "mlnx")
    (garbage / MANIFEST_NAME).write_bytes(b"schema = [")
    outside = _drop(host, 0, X, bundle="elsewhere").rename(host.root / "outside")
    (linked / MANIFEST_NAME).unlink()
    (linked / MANIFEST_NAME).symlink_to(outside / MANIFEST_NAME)
    foreign = foreign.rename(host.incoming / drop_name("nvidia", 3, "ff"))
    for_y = _drop(host, 4, Y)
    assert _scan(host) == [for_y]
    assert not garbage.exists() and not linked.exists() and not foreign.exists()
    for_x = _drop(host, 5, X)
    newest = _drop(host, 6, X)
    (newest / MANIFEST_NAME).write_bytes(b"\xff")
    assert _scan(host) == [for_y, for_x, newest]


def test_past_the_read_bound_a_drop_names_no_kernel(host: Layout) -> None:
    """A scan reads at most MAX_READ manifests, newest first: a drop for Y behind that many
    newer drops of its bundle is read no more and goes as any older drop of its bundle; one
    fewer, and it is read and kept."""
    for newer in (MAX_READ - 1, MAX_READ):
        for entry in host.incoming.iterdir():
            shutil.rmtree(entry)
        for_y = _drop(host, 1, Y)
        for n in range(newer):
            _drop(host, 10 + n, X)
        kept = _scan(host)
        assert (for_y in kept, len(kept)) == ((True, 2) if newer < MAX_READ else (False, 1))


def test_intake_keeps_a_waiting_drop_for_the_next_kernel_beside_the_running_kernels(
    host: Layout, signed: dict[str, Path], kernel: str
) -> None:
    """A drop for the next kernel waits in incoming (its module tree is not installed yet)
    when a newer drop of the bundle for the running kernel arrives: intake takes the
    running kernel's in and the next kernel's drop stays, waiting, for a later scan."""
    mods = [ModuleSpec(signed["ms_exporter"])]
    scratch = host.root / "scratch"
    scratch.mkdir()
    for_running = stage(host.incoming, bundle="test", version="2", kernel=kernel, modules=mods)
    named = parse_drop_name(for_running.name)
    assert named is not None
    early = int(named[1].split(".")[0]) - 1
    staged = stage(scratch, bundle="test", version="1", kernel=Y, modules=mods)
    for_next = host.incoming / drop_name("test", early, "00")
    os.rename(staged, for_next)  # staged first, so no stager supersede is involved
    outcomes = make_intake(host).run()
    assert [(o.drop, o.accepted, o.waiting) for o in outcomes] == [
        (for_next, False, True),
        (for_running, True, False),
    ]
    assert for_next.is_dir() and not for_running.exists()
    b = load(host.state).bundle("test")
    assert b.generations[str(b.pending)].kernel == kernel


def test_an_older_drop_that_is_a_symlink_goes_and_what_it_leads_to_stays(host: Layout) -> None:
    """A container plants a symlink named as an older drop of the bundle, leading to a
    directory with a manifest (a stored generation's, say): the scan supersedes the link and
    never unlinks the manifest it leads to."""
    target = _drop(host, 0, X, bundle="elsewhere").rename(host.root / "target")
    via = host.incoming / drop_name("nvidia", 1, "00")
    via.symlink_to(target, target_is_directory=True)
    newer = _drop(host, 2, X)
    assert _scan(host) == [newer]
    assert not os.path.lexists(via) and (target / MANIFEST_NAME).is_file()

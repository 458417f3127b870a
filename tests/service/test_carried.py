"""A generation is kept for its kernel: a boot into a kernel that neither the pending nor the
active generation is built for loads the newest retained one built for it, so a later drop
for the running kernel (which takes the one pending slot) does not leave a kernel update
without its driver, and a boot back into an older kernel finds its driver."""

from __future__ import annotations

import errno
import io
import json
from dataclasses import replace
from pathlib import Path

import pytest

from service.boot.plan import choose
from service.bundles.cover import carried, next_kernel_cover, would_load
from service.bundles.phase import Phase
from service.bundles.state import BundleState, Generation, State, kernels_last
from service.bundles.statefile import load, save
from service.cli import main
from service.generations.store import Store
from service.host.nextboot import How, NextKernel
from service.layout import Layout, kernel_image, modules_dir
from service.publish.announce import host_doc
from stager.schema.manifest import Manifest, ModuleEntry
from stager.schema.paths import MANIFEST_NAME
from tests.service.fakes import FakeKernel, boot_with, pending
from tests.service.test_sequences import reboot

OTHER = "6.99.0-other"  # the kernel the node ran before the update (no tree installed here)


def cli(*argv: str) -> tuple[int, str]:
    """``modstage ARGV`` in this process: (exit code, stdout)."""
    out = io.StringIO()
    return main(list(argv), out), out.getvalue()


def other_kernel_generation(host: Layout, version: str, added: float) -> Generation:
    """A generation built for kernel OTHER, in the store (its manifest) and as a record."""
    m = Manifest("demo", version, OTHER, (ModuleEntry("ms_other.ko", "0" * 64),))
    path = Store(host.store).path(m.digest)
    path.mkdir(parents=True)
    (path / MANIFEST_NAME).write_bytes(m.to_toml())
    return Generation(m.digest, version, OTHER, added=added)


def update_staged_then_pending_slot_taken(
    host: Layout, signed: dict[str, Path], kernel: str
) -> tuple[str, str, str]:
    """The node ran OTHER with x1 active; the driver for the next kernel (``kernel``) was
    staged and accepted (y), then a driver upgrade for OTHER (x2) took the pending slot; the
    node is now booting into ``kernel``. Returns (y, x1, x2)."""
    y = pending(host, kernel, [(signed["ms_exporter"], "")], bundle="demo")
    b = load(host.state).bundle("demo")
    y_gen = b.generations[y]
    x1 = other_kernel_generation(host, "1", added=y_gen.added - 100)
    x2 = other_kernel_generation(host, "2", added=y_gen.added + 100)
    b = replace(
        b,
        phase=Phase.PENDING,
        active=x1.id,
        pending=x2.id,
        generations={y: y_gen, x1.id: x1, x2.id: x2},
    )
    save(host.state, State({"demo": b}))
    reboot(host)
    return y, x1.id, x2.id


def test_the_next_kernel_s_generation_loads_after_a_later_drop_took_the_pending_slot(
    host: Layout, signed: dict[str, Path], kernel: str
) -> None:
    """Before the reboot the host tells the driver pod a boot into the new kernel loads y
    (ready, y's id and version; no hold); ``modstage boot`` on the new kernel loads y, exits
    0 and says the pending x2 is for kernel OTHER; x2 stays pending, no reboot is required
    for it here, and ``wait`` answers for y, live."""
    root = ["--root", str(host.root)]
    y, x1, x2 = update_staged_then_pending_slot_taken(host, signed, kernel)
    state = load(host.state)
    assert next_kernel_cover(state.bundle("demo"), kernel) == "ready"
    doc = host_doc(host, state, NextKernel(kernel, How.CONFIG))
    assert doc["bundles"]["demo"] == {"next": "ready", "next_generation": y, "next_version": "1"}
    code, out = cli("boot", *root)
    assert code == 0, out
    assert f"demo: active (active {y}, pending {x2})" in out
    assert f"pending {x2[:12]} (2) is for kernel {OTHER}" in out
    b = load(host.state).bundle("demo")
    assert (b.phase, b.active, b.pending) == (Phase.ACTIVE, y, x2)
    assert x1 in b.generations and not b.generations[x1].failed
    assert (host.sys / "module/ms_exporter/initstate").exists()
    assert cli("status", *root, "--reboot-required")[0] == 1
    code, out = cli(
        "wait",
        *("--status-dir", str(host.status), "--boot-id-file", str(host.boot_id)),
        *("--bundle", "demo", "--timeout", "0"),
    )
    assert code == 0 and f"generation {y[:12]} is active" in out, out


def test_a_held_bundle_loads_no_carried_generation(
    host: Layout, signed: dict[str, Path], kernel: str
) -> None:
    """Held by an admin, the bundle takes nothing it was not running: the announcement says
    ``held`` for the next kernel, and the boot records ``other_kernel`` and exits 1."""
    root = ["--root", str(host.root)]
    update_staged_then_pending_slot_taken(host, signed, kernel)
    assert cli("hold", *root, "demo")[0] == 0
    assert next_kernel_cover(load(host.state).bundle("demo"), kernel) == "held"
    code, out = cli("boot", *root)
    assert code == 1, out
    assert load(host.state).bundle("demo").phase is Phase.OTHER_KERNEL


def test_a_carried_generation_that_fails_is_not_tried_again_until_retried(
    host: Layout, signed: dict[str, Path], kernel: str
) -> None:
    """The kernel refuses y's module: y is marked failed (the host grades failed), the next
    boot loads nothing of the bundle instead of trying y again, and ``retry`` makes y
    pending, so a reboot is required for it and the boot after loads it."""
    root = ["--root", str(host.root)]
    y, _x1, _x2 = update_staged_then_pending_slot_taken(host, signed, kernel)
    boot_with(host, FakeKernel(fail={"ms_exporter": errno.ENOKEY})).run()
    b = load(host.state).bundle("demo")
    assert b.phase is Phase.FAILED and b.generations[y].failed
    assert carried(b, kernel) is None and next_kernel_cover(b, kernel) == "none"
    assert json.loads(cli("status", *root, "--json")[1])["health"] == "failed"
    reboot(host)
    assert cli("boot", *root)[0] == 1
    assert not (host.sys / "module/ms_exporter").exists()
    assert cli("retry", *root, "demo", y[:12])[0] == 0
    assert cli("status", *root, "--reboot-required")[0] == 0
    reboot(host)
    assert cli("boot", *root)[0] == 0
    assert load(host.state).bundle("demo").active == y


def test_the_carried_generation_is_the_newest_usable_one_for_the_kernel() -> None:
    """Among the retained generations built for a kernel, the newest that neither failed nor
    was rolled back from, and never the active or pending one; none for a kernel without."""
    gens = [
        Generation("a" * 64, "1", "K", added=1.0),
        Generation("b" * 64, "2", "K", added=2.0),
        Generation("c" * 64, "3", "K", added=3.0, failed="ENOKEY"),
        Generation("d" * 64, "4", "K", added=4.0, rolled_back="rollback to a"),
        Generation("e" * 64, "5", "X", added=5.0),
    ]
    b = BundleState(active="e" * 64, generations={g.id: g for g in gens})
    found = carried(b, "K")
    assert found is not None and found.id == "b" * 64
    assert carried(b, "X") is None and carried(b, "Z") is None
    assert would_load(replace(b, pending="b" * 64), "K") == gens[1]  # pending first
    held = replace(b, held=True)
    assert would_load(held, "K") is None and next_kernel_cover(held, "K") == "held"
    assert next_kernel_cover(b, "K") == "ready" and next_kernel_cover(b, "Z") == "none"


def test_rollback_takes_the_running_kernel_s_generation_and_says_which_boot_loads_one(
    host: Layout, signed: dict[str, Path], kernel: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """On the new kernel with the carried y active: a plain ``rollback`` does not offer x1,
    built for the old kernel (nothing earlier is built for this one: refused, naming the
    kernel); naming x1 is the admin's choice, and the verb says it loads at the next boot
    into the old kernel, not at the next boot."""
    root = ["--root", str(host.root)]
    _y, x1, _x2 = update_staged_then_pending_slot_taken(host, signed, kernel)
    assert cli("boot", *root)[0] == 0
    capsys.readouterr()
    assert cli("rollback", *root, "demo")[0] == 1
    assert f"no earlier generation built for kernel {kernel}" in capsys.readouterr().err
    modules_dir(host, OTHER).mkdir(parents=True)  # the old kernel is still installed
    code, out = cli("rollback", *root, "demo", x1[:12])
    assert code == 0, out
    assert f"loads at the next boot into kernel {OTHER} (running {kernel})" in out, out


@pytest.mark.parametrize("verb", ["rollback", "retry"])
def test_a_generation_for_a_kernel_no_longer_installed_is_refused(
    host: Layout,
    signed: dict[str, Path],
    kernel: str,
    capsys: pytest.CaptureFixture[str],
    verb: str,
) -> None:
    """On the new kernel, with the old kernel removed: naming x1 (built for it) to
    ``rollback``, or to ``retry`` once it failed, is refused (exit 1) naming its kernel and
    the installed ones, and the bundle's record is unchanged: no boot could load it."""
    root = ["--root", str(host.root)]
    _y, x1, _x2 = update_staged_then_pending_slot_taken(host, signed, kernel)
    assert cli("boot", *root)[0] == 0
    if verb == "retry":
        b = load(host.state).bundle("demo")
        failed = replace(b.generations[x1], failed="ENOEXEC: boom")
        save(host.state, State({"demo": replace(b, generations={**b.generations, x1: failed})}))
    before = load(host.state)
    capsys.readouterr()
    assert cli(verb, *root, "demo", x1[:12])[0] == 1
    err = capsys.readouterr().err
    assert f"built for kernel {OTHER}, which is not installed on this host" in err, err
    assert f"(installed: {kernel})" in err, err
    assert load(host.state) == before


def test_retention_keeps_the_newest_generation_of_each_installed_kernel(
    host: Layout, signed: dict[str, Path], kernel: str
) -> None:
    """``prune --keep 0`` before the reboot: y, neither active nor pending but the newest
    generation for the installed ``kernel``, stays (a boot into it loads it). A drop with
    ``retain`` 1 keeps the same way, and forgets it once that kernel is removed."""
    root = ["--root", str(host.root)]
    y, x1, x2 = update_staged_then_pending_slot_taken(host, signed, kernel)
    code, out = cli("prune", *root, "--keep", "0")
    assert code == 0 and "nothing to prune" in out, out
    b = load(host.state).bundle("demo")
    assert set(b.generations) == {y, x1, x2} and Store(host.store).has(y)
    z = Generation("f" * 64, "9", OTHER, added=b.generations[x2].added + 1)
    kept = b.staged(z, retain=1, installed={kernel, OTHER})
    assert set(kept.generations) == {x1, y, z.id}  # x1 active; x2, older of OTHER, past retain
    assert set(b.staged(z, retain=1, installed={OTHER}).generations) == {x1, z.id}


def test_a_new_version_failing_at_its_first_boot_into_the_kernel_falls_back_to_the_carried_one(
    host: Layout, signed: dict[str, Path], kernel: str
) -> None:
    """Booting into ``kernel`` with x1 (built for OTHER) active, y (v1) carried for
    ``kernel`` and v2 pending for it: v2's module fails at init, so v2 is failed and y,
    the older driver built for this kernel, is brought up in the same boot, not nothing."""
    y = pending(host, kernel, [(signed["ms_exporter"], "")], version="1", bundle="demo")
    v2 = pending(host, kernel, [(signed["ms_params"], "")], version="2", bundle="demo")
    b = load(host.state).bundle("demo")
    x1 = other_kernel_generation(host, "1", added=b.generations[y].added - 100)
    b = replace(
        b, phase=Phase.PENDING, active=x1.id, pending=v2, generations={**b.generations, x1.id: x1}
    )
    save(host.state, State({"demo": b}))
    assert carried(b, kernel) == b.generations[y]
    reboot(host)
    fake = FakeKernel(fail={"ms_params": errno.ENOKEY})
    boot_with(host, fake).run()
    after = load(host.state).bundle("demo")
    assert after.phase is Phase.ACTIVE and after.active == y
    assert after.generations[v2].failed and "ms_exporter" in fake.live
    assert "ms_params" not in fake.live


def _next_kernel_generation(host: Layout, release: str, added: float) -> Generation:
    """A generation built for the next kernel ``release``, in the store and as a record."""
    m = Manifest("demo", "2", release, (ModuleEntry("ms_next.ko", "1" * 64),))
    path = Store(host.store).path(m.digest)
    path.mkdir(parents=True)
    (path / MANIFEST_NAME).write_bytes(m.to_toml())
    return Generation(m.digest, "2", release, added=added)


def _v2_active_and_the_next_kernel_s_pending(
    host: Layout, signed: dict[str, Path], kernel: str
) -> tuple[str, Generation, Generation, str]:
    """``demo`` running v2 on ``kernel`` with v1 retained and the next kernel's build of v2
    (y) pending; the next kernel installed and named: (v1's id, v2, y, the next kernel)."""
    nxt = "6.99.1-next"
    modules_dir(host, nxt).mkdir(parents=True)
    kernel_image(host, nxt).parent.mkdir(parents=True, exist_ok=True)
    kernel_image(host, nxt).write_bytes(b"MZ")
    host.config.write_text(f'[kernel]\nnext = "{nxt}"\n')
    v1 = pending(host, kernel, [(signed["ms_exporter"], "")], version="1", bundle="demo")
    b = load(host.state).bundle("demo")
    v2 = replace(b.generations[v1], id="a" * 64, version="2", added=b.generations[v1].added + 1)
    y = _next_kernel_generation(host, nxt, added=v2.added + 1)
    b = replace(
        b,
        phase=Phase.PENDING,
        active=v2.id,
        pending=y.id,
        generations={v1: b.generations[v1], v2.id: v2, y.id: y},
    )
    save(host.state, State({"demo": b}))
    assert next_kernel_cover(b, nxt) == "ready"
    return v1, v2, y, nxt


def test_a_verb_s_json_names_the_kernels_it_acts_on(
    host: Layout, signed: dict[str, Path], kernel: str
) -> None:
    """``rollback --json`` says which kernel the generation it made pending is built for,
    the running kernel, the kernel the next boot runs and what that boot brings up."""
    v1, _v2, y, nxt = _v2_active_and_the_next_kernel_s_pending(host, signed, kernel)
    code, out = cli("rollback", "--root", str(host.root), "demo", v1[:12], "--json")
    assert code == 0, out
    doc = json.loads(out)
    assert (doc["pending"], doc["pending_kernel"], doc["running_kernel"]) == (v1, kernel, kernel)
    assert (doc["next_kernel"], doc["next_boot_brings"]) == (nxt, y.id)


def test_a_rollback_on_the_running_kernel_keeps_the_next_kernel_s_driver(
    host: Layout, signed: dict[str, Path], kernel: str
) -> None:
    """Running ``kernel`` with v2 active and the next kernel's v2 (y) pending: ``rollback``
    makes v1 pending for ``kernel`` and rolls back from the active v2 only; y, built for
    the next kernel, is displaced but not rolled back from, so the next kernel stays
    ``ready`` (carried), the driver pod's drop of it is taken again, retention keeps it,
    and the verb says the next boot runs the next kernel and brings up y."""
    v1, v2, y, nxt = _v2_active_and_the_next_kernel_s_pending(host, signed, kernel)
    code, out = cli("rollback", "--root", str(host.root), "demo", v1[:12])
    assert code == 0, out
    assert (
        f"loads at a boot into kernel {kernel}; the next boot runs kernel {nxt} and brings up "
        f"{y.id[:12]} (2)" in out
    ), out
    after = load(host.state).bundle("demo")
    assert after.pending == v1 and after.generations[v2.id].rolled_back
    assert after.generations[y.id].rolled_back is None
    assert next_kernel_cover(after, nxt) == "ready" and carried(after, nxt) == y
    live = replace(after, phase=Phase.ACTIVE, active=v1, pending=None)
    assert live.staged(y, retain=0, installed={kernel, nxt}).pending == y.id
    pruned = live.staged(
        replace(v2, id="c" * 64, added=y.added + 1), retain=0, installed={kernel, nxt}
    )
    assert y.id in pruned.generations


def test_retention_keeps_what_a_boot_into_the_kernel_loads_not_a_rolled_back_newer_one() -> None:
    """For an installed kernel, the newest generation an admin rolled back from is not
    what a boot into it loads: retention keeps the carried one (``kernels_last``)."""
    a = Generation("a" * 64, "550", "X", added=10)
    c = Generation("c" * 64, "535", "Y", added=1)
    p = Generation("p" * 64, "550", "Y", added=3, rolled_back="rollback to aaaaaaaaaaaa")
    b = BundleState(phase=Phase.ACTIVE, active=a.id, generations={g.id: g for g in (a, c, p)})
    assert carried(b, "Y") == c
    assert kernels_last(b.generations, {"X", "Y"}) == {a.id, c.id}


def test_a_pending_generation_out_of_boot_attempts_is_not_ready() -> None:
    """A pending generation for the next kernel that used its boot attempts is expired by
    that boot (``plan.choose``): its cover is not ``ready`` once the attempts are counted."""
    a = Generation("a" * 64, "550", "X", added=1)
    p = Generation("p" * 64, "550", "Y", added=2, attempts=3)
    b = BundleState(phase=Phase.PENDING, active=a.id, pending=p.id, generations={a.id: a, p.id: p})
    assert choose("nvidia", b, "Y", 3).generation is None
    assert next_kernel_cover(b, "Y", max_attempts=3) == "none"
    assert next_kernel_cover(b, "Y", max_attempts=4) == "ready"

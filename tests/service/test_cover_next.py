"""The next kernel's cover: ``ready`` > ``waiting`` > ``refused`` > ``held`` > ``none``, and
no generation below the bundle's current ``min_version`` is carried or called ready."""

from __future__ import annotations

import json
import sys
from dataclasses import replace
from pathlib import Path

import pytest

from service.boot.plan import choose
from service.bundles.cover import carried, next_kernel_cover, would_load
from service.bundles.phase import Phase
from service.bundles.state import BundleState, Generation, State
from service.bundles.statefile import load, save
from service.cli import main
from service.config import Config
from service.layout import Layout
from service.publish.arrivals import arrivals, next_covers
from service.publish.labels import write_labels
from service.publish.operator import mirror_status
from service.rebooting.gate import Gate, uncovered
from stager.drop import ModuleSpec, stage
from stager.schema.manifest import Manifest, ModuleEntry
from stager.schema.paths import MANIFEST_NAME
from tests.service.fakes import make_intake, pending

RUNNING, NEXT = "6.1.0-run", "6.12.0-next"


def gen(gid: str, version: str, kernel: str, added: float) -> Generation:
    """A generation record (no store contents: the cover reads records only)."""
    return Generation(gid * 8, version, kernel, added=added)


def active_on_running() -> BundleState:
    """A bundle whose only generation, active, is built for the running kernel."""
    x = gen("a", "2.0", RUNNING, 10.0)
    return BundleState(phase=Phase.ACTIVE, active=x.id, generations={x.id: x})


def test_the_cover_s_precedence() -> None:
    """Nothing for NEXT: ``none``; a refusal recorded for it: ``refused``; a drop that
    arrived as well: ``waiting``; a pending generation for NEXT: ``ready`` whatever else
    holds. Held by an admin: ``held``, unless a drop for NEXT was refused after that
    generation was taken in (``refused``); one refused before it leaves ``held``."""
    b = active_on_running()
    assert next_kernel_cover(b, NEXT) == "none"
    assert next_kernel_cover(b, NEXT, refused_at=50.0) == "refused"
    assert next_kernel_cover(b, NEXT, refused_at=50.0, arrived=True) == "waiting"
    y = gen("b", "2.1", NEXT, 100.0)
    staged = b.with_generation(y).move(Phase.PENDING, pending=y.id)
    assert next_kernel_cover(staged, NEXT, refused_at=200.0, arrived=True) == "ready"
    held = replace(staged, held=True)
    assert next_kernel_cover(held, NEXT) == "held"
    assert next_kernel_cover(held, NEXT, refused_at=50.0) == "held"  # y came after it
    assert next_kernel_cover(held, NEXT, refused_at=200.0) == "refused"
    assert next_kernel_cover(held, NEXT, refused_at=200.0, arrived=True) == "waiting"


def test_a_generation_below_the_floor_is_not_carried() -> None:
    """y (1.0) built for NEXT is retained while the running kernel's x1 is active and x2
    pending: carried for NEXT without a floor, and neither carried, loaded by the boot's
    choice, nor called ready once ``min_version`` is 2.0 (a floor set after it was taken
    in); at 1.0 it is again."""
    x1, x2 = gen("a", "2.0", RUNNING, 10.0), gen("c", "2.2", RUNNING, 30.0)
    y = gen("b", "1.0", NEXT, 20.0)
    b = BundleState(
        phase=Phase.PENDING,
        active=x1.id,
        pending=x2.id,
        generations={g.id: g for g in (x1, x2, y)},
    )
    assert carried(b, NEXT) == y and choose("demo", b, NEXT, 3).generation == y.id
    assert carried(b, NEXT, "2.0") is None and would_load(b, NEXT, "2.0") is None
    assert choose("demo", b, NEXT, 3, "2.0").generation is None
    assert next_kernel_cover(b, NEXT, floor="2.0") == "none"
    assert next_kernel_cover(b, NEXT, floor="1.0") == "ready"


def write_drop(incoming: Path, bundle: str, kernel: str, name: str = "0" * 20 + ".ab") -> Path:
    """A complete drop directory holding only a manifest for ``kernel``."""
    drop = incoming / f"{bundle}.{name}"
    drop.mkdir(parents=True)
    m = Manifest(bundle, "3.0", kernel, (ModuleEntry("ms_x.ko", "0" * 64),))
    (drop / MANIFEST_NAME).write_bytes(m.to_toml())
    return drop


def test_a_drop_for_the_next_kernel_in_incoming_makes_it_waiting(tmp_path: Path) -> None:
    """A drop of ``demo`` for NEXT sits in incoming: its cover is ``waiting`` and the gate
    names it (still holding: only ``ready`` releases), as it names a refused one; a drop for another kernel, one
    whose directory is named for another bundle, or one without a manifest counts not."""
    host = Layout(tmp_path)
    state = State({"demo": active_on_running(), "other": active_on_running()})
    write_drop(host.incoming, "demo", NEXT)
    write_drop(host.incoming, "other", RUNNING)
    (host.incoming / f"other.{'1' * 20}.cd").mkdir()  # no manifest: not complete
    stray = write_drop(host.incoming, "stray", NEXT, "2" * 20 + ".ef")
    stray.rename(host.incoming / f"other.{'2' * 20}.ef")  # named for another bundle
    assert arrivals(host, Config()) == {"demo": frozenset({NEXT}), "other": frozenset({RUNNING})}
    covers = next_covers(host, Config(), state, NEXT)
    assert covers == {"demo": "waiting", "other": "none"}
    assert uncovered(state, NEXT, covers) == covers
    gate = Gate(NEXT, ("demo", "other"), 0.0, 100.0, 50.0, covers)
    assert gate.holds
    assert f"demo's drop for {NEXT} arrived and waits to be judged" in gate.line()
    assert "other's" not in gate.line()
    refused = Gate(NEXT, ("demo",), 0.0, 100.0, 50.0, {"demo": "refused"})
    assert f"demo's newest drop for {NEXT} was refused" in refused.line()


def test_a_drop_for_the_next_kernel_refused_by_intake_makes_it_refused(
    host: Layout, signed: dict[str, Path], kernel: str
) -> None:
    """Intake refuses a drop of ``demo`` for the next kernel (below ``min_version``): its
    quarantine record names that kernel and the cover says ``refused``; a drop for that
    kernel accepted after it makes it ``ready``."""
    pending(host, kernel, [(signed["ms_exporter"], "")], version="5.0", bundle="demo")
    b = load(host.state).bundle("demo")
    save(host.state, State({"demo": b.move(Phase.ACTIVE, active=b.pending, pending=None)}))
    config = Config.from_dict({"bundles": {"demo": {"min_version": "5.0"}}})
    mods = [ModuleSpec(signed["ms_exporter"], "")]
    stage(host.incoming, bundle="demo", version="4.0", kernel=NEXT, modules=mods)
    [outcome] = make_intake(host, config).run()
    assert not outcome.accepted and "min_version" in outcome.reasons[0], outcome.reasons
    state = load(host.state)
    assert next_covers(host, config, state, NEXT) == {"demo": "refused"}
    assert next_covers(host, config, state, kernel) == {"demo": "ready"}
    y = Generation("f" * 64, "6.0", NEXT, added=1e12)  # taken in after the refusal
    later = state.bundle("demo").with_generation(y).move(Phase.PENDING, pending=y.id)
    assert next_covers(host, config, State({"demo": later}), NEXT) == {"demo": "ready"}
    stale = replace(later, held=True)
    assert next_covers(host, config, State({"demo": stale}), NEXT) == {"demo": "held"}


def test_the_boot_loads_no_carried_generation_below_the_floor(
    host: Layout, signed: dict[str, Path], kernel: str
) -> None:
    """y (1) for the booted kernel is carried while x2 for another kernel is pending; with
    ``[bundles.demo] min_version = "2"`` set since, the boot loads nothing of the bundle
    (it records ``other_kernel``) and y's module stays out of the kernel."""
    from service.bundlepolicy import BundlePolicy
    from tests.service.fakes import FakeKernel, boot_with
    from tests.service.test_carried import update_staged_then_pending_slot_taken

    update_staged_then_pending_slot_taken(host, signed, kernel)
    floor = (("demo", BundlePolicy(min_version="2")),)
    boot_with(host, FakeKernel(), bundles=floor).run()
    assert load(host.state).bundle("demo").phase is Phase.OTHER_KERNEL
    assert not (host.sys / "module/ms_exporter").exists()


def test_a_waiting_drop_shows_in_status_the_announcement_and_the_labels(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """After a kernel update to NEXT with nvidia active on the running kernel and a drop of
    nvidia for NEXT in incoming: ``--reboot-required`` still holds (exit 4) and says the drop
    waits to be judged, plain status says it on its reboot line, ``--json`` gives
    ``reboot.covers`` ``{"nvidia": "waiting"}``, and ``_host.json`` and the node labels say
    ``waiting``, also written without the config at hand (the daemon's scan)."""
    from tests.service.test_reboot_required import NEXT as UPDATE
    from tests.service.test_reboot_required import active, updated

    layout = updated(tmp_path, State({"nvidia": active()}))
    write_drop(layout.incoming, "nvidia", UPDATE)
    features = layout.host("/etc/kubernetes/node-feature-discovery/features.d")
    features.mkdir(parents=True)
    root = ["--root", str(layout.root)]
    code = main(["status", *root, "--reboot-required"], sys.stdout)
    out = capsys.readouterr().out
    assert code == 4, out
    assert f"nvidia's drop for {UPDATE} arrived and waits to be judged" in out
    main(["status", *root], sys.stdout)
    assert "arrived and waits to be judged" in capsys.readouterr().out
    main(["status", *root, "--json"], sys.stdout)
    doc = json.loads(capsys.readouterr().out)
    assert doc["reboot"]["covers"] == {"nvidia": "waiting"}
    mirror_status(layout, Config.load(layout.config))
    host_file = json.loads((layout.status / "_host.json").read_bytes())
    assert host_file["bundles"]["nvidia"] == {"next": "waiting"}
    assert "modstage.io/nvidia.next=waiting" in (features / "modstage").read_text()
    (features / "modstage").unlink()  # as the daemon's scan writes them: no config passed
    write_labels(layout, Config().node_labels, load(layout.state), UPDATE)
    assert "modstage.io/nvidia.next=waiting" in (features / "modstage").read_text()

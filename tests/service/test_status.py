"""``modstage status``: health decisions from plain values, and the command on a temporary host."""

from __future__ import annotations

import io
import json
from dataclasses import replace
from pathlib import Path

import pytest

from service.bundles.phase import Phase
from service.bundles.records import ModuleLoad, RebootIntent, RefusedDrop
from service.bundles.state import BundleState, Generation, State
from service.bundles.statefile import save
from service.cli import main
from service.layout import Layout
from service.publish.bundle_status import write_status
from service.status.collect import collect
from service.status.hardware import memory_summary
from service.status.health import Health, bundle_health, overall
from service.status.live import LiveModule
from service.status.report import SCHEMA, SignerRow
from service.status.view import lines
from stager.schema.record import dump
from stager.schema.statusfile import StatusFile
from tests.hosts import running_host

KERNEL = "6.1.0-test"
OLD, NEW = "a" * 64, "b" * 64


def active_bundle() -> BundleState:
    """A bundle whose generation OLD came up and is active."""
    b = BundleState().with_generation(Generation(OLD, "1.0", KERNEL, added=100.0))
    b = b.move(Phase.PENDING, pending=OLD).move(Phase.LOADING)
    loaded = (ModuleLoad("nvidia", "ABC", 412.5),)
    return b.move(Phase.ACTIVE, active=OLD, pending=None, loaded=loaded, note="up")


def failed_new(fallback: bool) -> BundleState:
    """NEW failed at boot; with ``fallback`` the last known good OLD came back."""
    b = active_bundle().with_generation(Generation(NEW, "2.0", KERNEL, added=200.0))
    b = b.move(Phase.PENDING, pending=NEW).move(Phase.LOADING)
    gen = Generation(NEW, "2.0", KERNEL, added=200.0, attempts=1, failed="ENOKEY: unsigned")
    b = b.with_generation(gen).move(
        Phase.FAILED, pending=None, deployed=NEW, note="ENOKEY: unsigned"
    )
    if fallback:
        b = b.move(Phase.LOADING).move(Phase.ACTIVE, active=OLD)
    else:
        b = b.move(Phase.LOADING).move(Phase.FAILED, note="fallback failed too")
    return b


def host(tmp_path: Path, state: State) -> Layout:
    """A temporary host tree holding ``state``, a kernel release and a boot id."""
    layout = running_host(tmp_path, KERNEL, "boot-2")
    save(layout.state, state)
    for b in state.bundles.values():
        for m in b.loaded:
            live(layout, m.module, m.srcversion)
    return layout


def live(layout: Layout, module: str, srcversion: str, refcnt: int = 0) -> None:
    """Make ``module`` live in the host's sysfs with ``srcversion``."""
    base = layout.sys / "module" / module
    base.mkdir(parents=True, exist_ok=True)
    (base / "srcversion").write_text(srcversion + "\n")
    (base / "refcnt").write_text(f"{refcnt}\n")


def test_an_active_bundle_is_healthy() -> None:
    """A bundle whose only generation is active for the running kernel has nothing to report."""
    assert bundle_health(active_bundle(), None, kernel=KERNEL) == bundle_health(
        active_bundle(), StatusFile("nvidia", "active"), kernel=KERNEL
    )
    assert bundle_health(active_bundle(), None, kernel=KERNEL).health is Health.HEALTHY


def test_a_failed_generation_with_fallback_is_degraded() -> None:
    """A newer generation failed but the last known good runs: degraded, naming both."""
    verdict = bundle_health(failed_new(fallback=True), None, kernel=KERNEL)
    assert verdict.health is Health.DEGRADED
    assert "ENOKEY" in verdict.reasons[0] and OLD[:12] in verdict.reasons[0]


def test_a_failure_stays_degraded_until_a_newer_generation_comes_up() -> None:
    """Through the boot's transitions: NEW fails and OLD comes back (degraded), a plain
    reboot keeps it so, and OLD brought up again from pending (the admin's revert: its pod
    unloaded it and dropped it again) makes the bundle healthy, NEW's failure kept in
    its generations."""
    b = active_bundle().staged(Generation(NEW, "2.0", KERNEL, added=200.0), retain=3)
    b = b.booting(NEW).failed(NEW, "ENOKEY: unsigned").booting(OLD).went_live(OLD, ())
    assert bundle_health(b, None, kernel=KERNEL).health is Health.DEGRADED
    b = b.booting(OLD).went_live(OLD, ())
    assert bundle_health(b, None, kernel=KERNEL).health is Health.DEGRADED
    b = b.reloading(OLD).booting(OLD).went_live(OLD, ())
    assert bundle_health(b, None, kernel=KERNEL).health is Health.HEALTHY
    assert b.generations[NEW].failed


def test_no_active_generation_after_a_failure_is_failed() -> None:
    """When the fallback failed too, nothing of the bundle is loaded: failed."""
    verdict = bundle_health(failed_new(fallback=False), None, kernel=KERNEL)
    assert verdict.health is Health.FAILED
    assert any("fallback failed too" in r for r in verdict.reasons)


def test_an_old_failure_before_the_active_generation_is_forgotten() -> None:
    """A generation that failed before a newer one came up no longer degrades the bundle."""
    b = failed_new(fallback=True)
    newer = Generation("c" * 64, "3.0", KERNEL, added=300.0)
    b = b.with_generation(newer).move(Phase.PENDING, pending=newer.id).booting(newer.id)
    b = b.went_live(newer.id, ())
    assert bundle_health(b, None, kernel=KERNEL).health is Health.HEALTHY


def test_the_failure_shown_is_the_deployed_generations() -> None:
    """OLD active, a newer C pending, NEW deployed and failed: the bundle is degraded by
    NEW's failure (the one :meth:`BundleState.deployed_failure` names), and by no other
    failed generation, newer or older."""
    b = failed_new(fallback=True)
    newer = Generation("c" * 64, "3.0", KERNEL, added=300.0)
    other = Generation("d" * 64, "0.9", KERNEL, added=50.0, failed="ENOEXEC: old")
    b = b.with_generation(other).with_generation(newer).move(Phase.PENDING, pending=newer.id)
    assert (b.active, b.pending, b.deployed) == (OLD, newer.id, NEW)
    assert b.deployed_failure() == b.generations[NEW]
    verdict = bundle_health(b, None, kernel=KERNEL)
    assert verdict.health is Health.DEGRADED
    assert [r for r in verdict.reasons if "failed" in r] == [
        f"generation {NEW[:12]} (2.0) failed: ENOKEY: unsigned; running {OLD[:12]}"
    ]


def test_a_rejected_drop_is_degraded_with_its_reasons() -> None:
    """The status file's rejection makes the bundle degraded and says why."""
    doc = StatusFile("nvidia", "rejected", errors=("nvidia.ko: EKEYREJECTED",))
    verdict = bundle_health(None, doc, kernel=KERNEL)
    assert verdict == bundle_health(None, doc, kernel=None)
    assert verdict.health is Health.DEGRADED and "EKEYREJECTED" in verdict.reasons[0]


REFUSED = RefusedDrop(5.0, "modules/nvidia.ko: ENOKEY", "2.0", NEW, "digest-2")


def test_a_refused_drop_that_brought_the_last_good_back_says_so() -> None:
    """The drop was refused after the active generation's modules had left the kernel:
    while the reload waits, the rejection says that the last good generation is loaded
    again at the next reboot; once it runs (the boot rewrote the status file), the bundle
    stays degraded, saying the refused drop's pod keeps it until a drop is accepted (also
    when that pod drops the refused bundle again)."""
    doc = StatusFile("nvidia", "rejected", errors=("nvidia.ko: ENOKEY",))
    waiting = active_bundle().after_refusal(REFUSED, unloaded=True)
    verdict = bundle_health(waiting, doc, kernel=KERNEL)
    assert verdict.health is Health.DEGRADED
    assert verdict.reasons[0] == (
        "the last drop was rejected: nvidia.ko: ENOKEY; its modules had left the kernel: "
        f"the last good generation {OLD[:12]} (1.0) is loaded again at the next reboot"
    )
    up = waiting.booting(OLD).went_live(OLD, active_bundle().loaded)
    live = {"nvidia": LiveModule("nvidia", "ABC", None, 1)}
    verdict = bundle_health(up, StatusFile("nvidia", "active"), kernel=KERNEL, live=live)
    assert verdict.health is Health.DEGRADED and verdict.reasons == (
        "the drop of version 2.0 was rejected (modules/nvidia.ko: ENOKEY): the last good "
        f"generation {OLD[:12]} (1.0) runs, under the refused driver pod's config digest, "
        "until a drop is accepted",
    )
    assert (
        bundle_health(up, doc, kernel=KERNEL, live=live).reasons
        == (  # refused again
            "the last drop was rejected: nvidia.ko: ENOKEY; the last good generation "
            f"{OLD[:12]} (1.0) runs, under the refused driver pod's config digest, until a drop "
            "is accepted",
        )
    )
    assert bundle_health(active_bundle(), doc, kernel=KERNEL, live=live).reasons == (
        "the last drop was rejected: nvidia.ko: ENOKEY",
    )


def test_active_generation_for_another_kernel_is_a_missing_driver() -> None:
    """After a reboot into a kernel no generation targets, nothing of the bundle is loaded:
    failed, naming the running kernel (a driver-less node is never graded as fine)."""
    verdict = bundle_health(active_bundle(), None, kernel="6.2.0-new")
    assert verdict.health is Health.FAILED
    assert verdict.reasons[0].startswith("no generation for the running kernel 6.2.0-new")


def test_loading_left_over_from_an_earlier_boot_is_degraded() -> None:
    """A load recorded in another boot that never finished is degraded; in this boot it is not."""
    b = active_bundle().move(Phase.LOADING)
    stale = bundle_health(b, None, kernel=KERNEL, boot_id="boot-2", state_boot_id="boot-1")
    now = bundle_health(b, None, kernel=KERNEL, boot_id="boot-2", state_boot_id="boot-2")
    assert stale.health is Health.DEGRADED and now.health is Health.HEALTHY


@pytest.mark.parametrize(
    ("parts", "expected"),
    [
        ([], Health.HEALTHY),
        ([Health.HEALTHY, Health.DEGRADED], Health.DEGRADED),
        ([Health.FAILED, Health.DEGRADED], Health.FAILED),
    ],
)
def test_overall_is_the_worst_part(parts: list[Health], expected: Health) -> None:
    """The host is as healthy as its least healthy bundle."""
    assert overall(parts) is expected


def test_json_schema_on_a_host_with_a_fallback(tmp_path: Path) -> None:
    """``status --json`` carries schema 1, generations with roles, loaded modules, exit code 1."""
    layout = host(tmp_path, State({"nvidia": failed_new(fallback=True)}, boot_id="boot-2"))
    write_status(layout, "nvidia", failed_new(fallback=True), errors=["ENOKEY: unsigned"])
    out = io.StringIO()
    assert main(["status", "--root", str(tmp_path), "--json"], out) == 1
    doc = json.loads(out.getvalue())
    assert doc["schema"] == SCHEMA and doc["health"] == "degraded" and doc["exit_code"] == 1
    b = doc["bundles"]["nvidia"]
    assert {g["id"]: g["role"] for g in b["generations"]} == {OLD: "active", NEW: "failed"}
    assert b["loaded"] == [
        {
            "module": "nvidia",
            "srcversion": "ABC",
            "ms": 412.5,
            "already_loaded": False,
            "live": {"srcversion": "ABC", "version": None, "refcnt": 0},
        }
    ]
    assert b["history"][-1]["to"] == "active" and b["status_file"]["errors"] == ["ENOKEY: unsigned"]
    assert doc["reboot"]["required"] is False and doc["reboot"]["backend"] == "none"


def test_exit_code_2_when_a_bundle_failed(tmp_path: Path) -> None:
    """A bundle with nothing loaded after a failure makes ``status`` exit 2."""
    host(tmp_path, State({"nvidia": failed_new(fallback=False)}))
    assert main(["status", "--root", str(tmp_path)], io.StringIO()) == 2


def test_corrupt_state_is_failed_and_left_in_place(tmp_path: Path) -> None:
    """An unreadable state file is reported (exit 2), and status does not move it aside."""
    layout = host(tmp_path, State())
    layout.state.write_text("{not json")
    report = collect(layout)
    assert report.health is Health.FAILED and report.state_error
    assert layout.state.read_text() == "{not json"


def test_reboot_required_exit_codes(tmp_path: Path) -> None:
    """``--reboot-required`` exits 0 while a pending generation waits, 1 once it is active."""
    pending = active_bundle().with_generation(Generation(NEW, "2.0", KERNEL, added=200.0))
    pending = pending.move(Phase.PENDING, pending=NEW)
    host(tmp_path, State({"nvidia": pending}))
    out = io.StringIO()
    assert main(["status", "--root", str(tmp_path), "--reboot-required"], out) == 0
    assert out.getvalue().strip() == "nvidia"
    host(tmp_path, State({"nvidia": active_bundle()}))
    assert main(["status", "--root", str(tmp_path), "--reboot-required"], io.StringIO()) == 1


def test_memory_blocks_are_counted_by_node_zone_and_state(tmp_path: Path) -> None:
    """Online blocks count under their zone and node; offline ones have no zone."""
    base = tmp_path / "devices/system/memory"
    for n, state, zones, node in [
        (0, "online", "Normal", 0),
        (1, "online", "Normal", 0),
        (2, "online", "Movable", 1),
        (3, "offline", "Normal Movable", 1),
    ]:
        block = base / f"memory{n}"
        block.mkdir(parents=True)
        (block / "state").write_text(state + "\n")
        (block / "valid_zones").write_text(zones + "\n")
        (block / f"node{node}").symlink_to(tmp_path)
    assert [dump(m) for m in memory_summary(tmp_path)] == [
        {"node": 0, "zone": "Normal", "state": "online", "blocks": 2},
        {"node": 1, "zone": None, "state": "offline", "blocks": 1},
        {"node": 1, "zone": "Movable", "state": "online", "blocks": 1},
    ]


def test_a_block_spanning_zones_is_shown_in_words_an_admin_knows(tmp_path: Path) -> None:
    """The kernel's ``valid_zones`` of ``none`` (an online block spanning zones, boot memory)
    stays ``none`` in JSON but the text view says what it means, never "zone none"."""
    layout = host(tmp_path, State({"nvidia": active_bundle()}))
    block = layout.sys / "devices/system/memory/memory0"
    block.mkdir(parents=True)
    (block / "state").write_text("online\n")
    (block / "valid_zones").write_text("none\n")
    (block / "node0").symlink_to(tmp_path)
    report = collect(layout)
    assert [m.zone for m in report.memory] == ["none"]
    text = "\n".join(lines(report))
    assert "memory node 0 zone several (boot memory, cannot be moved) online: 1 blocks" in text
    assert "zone none" not in text


def test_plain_text_names_generations_modules_and_problems(tmp_path: Path) -> None:
    """Off a terminal the view is plain text showing the failure, the module and its load time."""
    layout = host(tmp_path, State({"nvidia": failed_new(fallback=True)}))
    text = "\n".join(lines(collect(layout)))
    assert "DEGRADED" in text and "ENOKEY: unsigned" in text
    assert "module nvidia srcversion ABC (412.5 ms; live, refcnt 0)" in text
    assert "\x1b[" not in text


def test_rich_view_renders_on_a_terminal(tmp_path: Path) -> None:
    """On a terminal the rich tables show each generation's short id and version."""
    from service.status.view import render_rich

    layout = host(tmp_path, State({"nvidia": failed_new(fallback=True)}))
    out = io.StringIO()
    render_rich(collect(layout), out)
    assert NEW[:12] in out.getvalue() and "2.0" in out.getvalue()


def test_both_views_show_each_signer_once_per_generation_in_the_kernels_key_form(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Plain and rich views show each signer once per generation, naming the generation
    (version and short id), the key as the kernel names it ('Subject: key id'), the modules
    it signed, and the running kernel's keyring that holds it (``.machine`` for a MOK) or
    that none does; the issuer only on request. Every module of both generations is signed
    by one key, so a view printing per module, or without the generation, fails."""
    from service.status.view import render_rich

    monkeypatch.setenv("COLUMNS", "250")  # one table row per line
    doc = collect(host(tmp_path, State({"nvidia": active_bundle()})))
    vendor = "Example GPU vendor: 7aeac1f52e49f8f1"
    files = ("nvidia.ko", "nvidia-uvm.ko", "nvidia-modeset.ko")
    issuer = "CN=Example GPU vendor"

    def row(gen: str, version: str, file: str, where: str | None) -> SignerRow:
        return SignerRow(
            gen, file, "7aeac1f5" + "00" * 40, where, version=version, signer=vendor, issuer=issuer
        )

    rows = tuple(row(OLD, "1.0", f, "machine") for f in files)
    rows += tuple(row(NEW, "2.0", f, None) for f in files)
    doc = replace(doc, bundles={"nvidia": replace(doc.bundles["nvidia"], signers=rows)})
    plain = [ln for ln in lines(doc) if vendor in ln]
    assert plain == [
        f"  signer of 1.0 ({OLD[:12]}) '{vendor}' for {', '.join(files)}: trusted by .machine",
        f"  signer of 2.0 ({NEW[:12]}) '{vendor}' for {', '.join(files)}: trusted by no keyring",
    ], plain
    assert issuer not in "\n".join(lines(doc))
    assert f"    issuer {issuer}" in lines(doc, issuers=True)
    out = io.StringIO()
    render_rich(doc, out)
    table = [ln for ln in out.getvalue().splitlines() if "7aeac1f52e49f8f1" in ln]
    assert len(table) == 2, out.getvalue()
    assert f"1.0 ({OLD[:12]})" in table[0] and ".machine" in table[0], table
    assert f"2.0 ({NEW[:12]})" in table[1] and "no keyring" in table[1], table
    assert all(vendor in ln for ln in table), table
    wide = io.StringIO()
    render_rich(doc, wide, issuers=True)
    assert issuer not in out.getvalue() and issuer in wide.getvalue()


def test_a_recorded_reboot_request_is_shown(tmp_path: Path) -> None:
    """The daemon's recorded request in this boot (when, how) is in --json and in the plain
    view."""
    scheduled = active_bundle().with_generation(Generation(NEW, "2.0", KERNEL, added=200.0))
    scheduled = scheduled.move(Phase.PENDING, pending=NEW).move(Phase.REBOOT_SCHEDULED)
    asked = RebootIntent(1.0, "boot-2", "kured", ("nvidia",), "r")
    layout = host(tmp_path, State({"nvidia": scheduled}, reboot=asked))
    report = collect(layout)
    assert report.reboot.asked == asked and report.reboot.scheduled == ("nvidia",)
    assert report.to_json()["reboot"]["asked"] == dump(asked)
    assert any("asked via kured at 1970-01-01T00:00:01Z" in line for line in lines(report))

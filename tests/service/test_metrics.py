"""The Prometheus textfile: parsed back with prometheus-client's own parser."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

from prometheus_client.parser import text_string_to_metric_families

from service.bundles.phase import Phase
from service.bundles.records import ModuleLoad
from service.bundles.state import BundleState, Generation, State
from service.bundles.statefile import save
from service.layout import Layout
from service.status.collect import collect
from service.status.metrics import Family, families, render, write_metrics
from tests.hosts import running_host

KERNEL = "6.1.0-test"
OLD, NEW = "a" * 64, "b" * 64


def fallback_host(tmp_path: Path) -> Layout:
    """A host where NEW failed at boot and OLD (two modules) is active again; a NEW2 is pending."""
    layout = running_host(tmp_path, KERNEL, boot_id=None)
    b = BundleState().with_generation(Generation(OLD, "1", KERNEL, added=1.0))
    b = b.move(Phase.PENDING, pending=OLD).move(Phase.LOADING)
    loaded = (
        ModuleLoad("nvidia", "S1", 400.0),
        ModuleLoad("nvidia_uvm", "S2", 100.0),
        ModuleLoad("i2c_core", "S3", already_loaded=True),
    )
    b = b.move(Phase.ACTIVE, active=OLD, loaded=loaded)
    b = b.with_generation(Generation(NEW, "2", KERNEL, added=2.0, attempts=1, failed="ENOKEY"))
    b = b.with_generation(Generation("c" * 64, "3", KERNEL, added=3.0, attempts=2))
    b = b.move(Phase.PENDING, pending="c" * 64)
    save(layout.state, State({"nvidia": b}))
    for m in loaded:
        (layout.sys / "module" / m.module).mkdir(parents=True)
        (layout.sys / "module" / m.module / "srcversion").write_text(f"{m.srcversion}\n")
    block = layout.sys / "devices/system/memory/memory7"
    block.mkdir(parents=True)
    (block / "state").write_text("offline\n")
    return layout


def samples(text: bytes) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """Every sample of an exposition text, keyed by name and sorted labels."""
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for fam in text_string_to_metric_families(text.decode())
        for s in fam.samples
    }


def test_textfile_holds_phase_reboot_loads_failures_attempts_and_memory(tmp_path: Path) -> None:
    """The written file parses and carries every metric the issue names with the right values."""
    layout = fallback_host(tmp_path)
    path = tmp_path / "textfile/modstage.prom"
    write_metrics(layout, path, verification={"nvidia": 1.5})
    got = samples(path.read_bytes())
    b = (("bundle", "nvidia"),)
    assert got[("modstage_bundle_phase", (*b, ("phase", "pending")))] == 1
    assert got[("modstage_bundle_phase", (*b, ("phase", "active")))] == 0
    assert got[("modstage_reboot_required", ())] == 1
    assert got[("modstage_bundle_reboot_required", b)] == 1
    assert got[("modstage_module_load_seconds", (*b, ("module", "nvidia")))] == 0.4
    assert got[("modstage_bundle_load_seconds", b)] == 0.5
    assert ("modstage_module_load_seconds", (*b, ("module", "i2c_core"))) not in got
    assert got[("modstage_bundle_failed_generations", b)] == 1
    assert got[("modstage_bundle_boot_attempts", b)] == 2
    assert got[("modstage_verification_seconds", b)] == 1.5
    assert got[("modstage_health", ())] == 1  # degraded: NEW failed after OLD
    info = (("active_version", "1"), *b, ("pending_version", "3"))
    assert got[("modstage_bundle_info", info)] == 1  # the versions, named
    mem = (("node", ""), ("state", "offline"), ("zone", ""))
    assert got[("modstage_memory_blocks", mem)] == 1
    assert not list(path.parent.glob(".*.tmp")), "the crash-safe write leaves no temporaries"


def _reference(fams: list[Family]) -> bytes:
    """The same families rendered by prometheus-client (the reference writer)."""
    from prometheus_client import CollectorRegistry, generate_latest
    from prometheus_client.core import GaugeMetricFamily
    from prometheus_client.registry import Collector

    class Families(Collector):
        def collect(self) -> Iterator[GaugeMetricFamily]:
            for f in fams:
                names = sorted({k for labels, _ in f.samples for k in labels})
                g = GaugeMetricFamily(f.name, f.help, labels=names)
                for labels, value in f.samples:
                    g.add_metric([labels.get(k, "") for k in names], value)
                yield g

    registry = CollectorRegistry(auto_describe=False)
    registry.register(Families())
    return generate_latest(registry)


def test_the_writer_matches_prometheus_client(tmp_path: Path) -> None:
    """modstage's writer yields the samples prometheus-client's renderer yields, both read
    back with prometheus-client's parser."""
    fams = families(collect(fallback_host(tmp_path)), {"nvidia": 0.25})
    assert len(samples(render(fams))) > 5
    assert samples(render(fams)) == samples(_reference(fams))


def test_label_values_are_escaped(tmp_path: Path) -> None:
    """Quotes, backslashes and newlines in a label survive the round trip."""
    fams = families(collect(Layout(tmp_path)), {'we"ird\\na\nme': 1.0})
    got = samples(render(fams))
    assert got[("modstage_verification_seconds", (("bundle", 'we"ird\\na\nme'),))] == 1.0


def test_empty_host_exports_health_but_no_bundles(tmp_path: Path) -> None:
    """With no state yet the host is healthy and no bundle series exist."""
    layout = running_host(tmp_path, "6.1.0-test", "boot-1")
    got = samples(render(families(collect(layout))))
    assert got[("modstage_health", ())] == 0 and got[("modstage_state_readable", ())] == 1
    assert not [k for k in got if k[0].startswith("modstage_bundle_")]

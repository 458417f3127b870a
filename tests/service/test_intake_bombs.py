"""Intake of drops holding decompression bombs: refused file by file, bounded memory in
flight whatever the workers, the per-drop budget from the config, good drops unharmed."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest
import zstandard

from service.bundles.phase import Phase
from service.bundles.statefile import load
from service.config import Config, Limits
from service.layout import Layout
from service.verify.compressed import budget
from service.verify.compressed.decompress import CHUNK
from service.verify.compressed.stated import MAX_WINDOW
from stager.drop import ModuleSpec, stage
from tests.kmod import SigningKey, compress, sign
from tests.service.fakes import make_intake
from tests.stager.argv import module_bytes

MiB = 1 << 20
SMALL = Config(limits=replace(Limits(), max_decompressed_bytes=256 * MiB))  # a faster test


@pytest.fixture
def good(modules: dict[str, Path], rsa_key: SigningKey, tmp_path: Path) -> Path:
    """ms_params signed with the trusted key, compressed with xz as kbuild does."""
    signed = sign(modules["ms_params"], rsa_key, tmp_path / "ms_params.ko")
    out = tmp_path / "ms_params.ko.xz"
    out.write_bytes(compress(signed.read_bytes(), "xz"))
    return out


def _bombs(where: Path, count: int, size: int) -> list[Path]:
    """``count`` zstd frames of ``size`` zeros each behind an ELF module header (what
    ``stage`` checks), written by a streaming compressor (no stated size: only the stream's
    cap stops them)."""
    c = zstandard.ZstdCompressor().compressobj()
    blob = c.compress(module_bytes(64)) + c.compress(bytes(size)) + c.flush()
    where.mkdir(exist_ok=True)
    out = []
    for i in range(count):
        path = where / f"bomb{i}.ko.zst"
        path.write_bytes(blob)
        out.append(path)
    return out


def test_many_bombs_with_forced_workers_stay_within_the_gate(
    host: Layout, good: Path, kernel: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Sixteen bombs and a good module in one drop, sixteen workers: each bomb refused with
    EFBIG naming its file, and no more decompressor memory in flight at once than the
    budget (or one decompressor alone)."""
    monkeypatch.setenv(budget.WORKERS_ENV, "16")
    monkeypatch.setattr(budget, "GATE", budget.Gate(budget.MEMORY_BUDGET))
    monkeypatch.setattr("service.verify.checks.GATE", budget.GATE)
    bombs = _bombs(tmp_path / "bombs", 16, 600 * MiB)
    stage(
        host.incoming,
        bundle="evil",
        version="1",
        kernel=kernel,
        modules=[ModuleSpec(good), *(ModuleSpec(b) for b in bombs)],
    )
    [outcome] = make_intake(host, SMALL).run()
    assert not outcome.accepted
    refused = [r for r in outcome.reasons if "bomb" in r]
    assert len(refused) == 16, outcome.reasons
    assert all("EFBIG" in r for r in refused), refused
    assert not any("ms_params" in r for r in outcome.reasons), outcome.reasons
    one = MAX_WINDOW + 3 * CHUNK + 2 * MiB
    assert 0 < budget.GATE.peak <= max(budget.MEMORY_BUDGET, one)
    assert budget.GATE.held == 0


def test_the_drops_decompressed_bytes_are_bounded_by_the_config(
    host: Layout, good: Path, kernel: str, tmp_path: Path
) -> None:
    """With limits.max_decompressed_bytes below what the drop's modules expand to, the
    drop is rejected naming the key, and state and store are untouched."""
    bombs = _bombs(tmp_path / "bombs", 4, 40 * MiB)  # under the module cap, 160 MiB together
    limits = replace(Limits(), max_decompressed_bytes=100 * MiB)
    stage(
        host.incoming,
        bundle="big",
        version="1",
        kernel=kernel,
        modules=[ModuleSpec(b) for b in bombs],
    )
    [outcome] = make_intake(host, Config(limits=limits)).run()
    assert not outcome.accepted
    assert any("limits.max_decompressed_bytes" in r for r in outcome.reasons), outcome.reasons
    assert list(host.store.iterdir()) == []
    assert "big" not in load(host.state).bundles


def test_the_limit_is_per_drop(
    host: Layout, modules: dict[str, Path], rsa_key: SigningKey, kernel: str, tmp_path: Path
) -> None:
    """A limit that each drop's module fits is not used up by the drops taken before it:
    three bundles, each with its own xz-compressed module (a module name belongs to one
    bundle), together past the limit, all taken in in one run."""
    sizes = []
    for version, name in enumerate(("ms_params", "ms_exporter", "ms_enodev"), start=1):
        signed = sign(modules[name], rsa_key, tmp_path / f"{name}.ko")
        sizes.append(signed.stat().st_size)
        own = tmp_path / f"{name}.ko.xz"
        own.write_bytes(compress(signed.read_bytes(), "xz"))
        stage(
            host.incoming,
            bundle=f"b{version}",
            version=str(version),
            kernel=kernel,
            modules=[ModuleSpec(own)],
        )
    limit = max(sizes) * 3 // 2
    assert sum(sizes) > limit  # together they would not fit
    config = Config(limits=replace(Limits(), max_decompressed_bytes=limit))
    outcomes = make_intake(host, config).run()
    assert len(outcomes) == 3 and all(o.accepted for o in outcomes), outcomes


def test_bombs_next_to_a_good_bundle_leave_it_taken_in(
    host: Layout, good: Path, kernel: str, tmp_path: Path
) -> None:
    """A drop of bombs and a good drop in the same run: the bombs are rejected (the drop
    quarantined, its status saying why), the good bundle is pending."""
    stage(
        host.incoming,
        bundle="evil",
        version="1",
        kernel=kernel,
        modules=[ModuleSpec(b) for b in _bombs(tmp_path / "bombs", 8, 600 * MiB)],
    )
    stage(host.incoming, bundle="nvidia", version="1", kernel=kernel, modules=[ModuleSpec(good)])
    outcomes = {o.bundle: o for o in make_intake(host, SMALL).run()}
    assert outcomes["nvidia"].accepted, outcomes["nvidia"].reasons
    assert not outcomes["evil"].accepted
    state = load(host.state)
    assert state.bundle("nvidia").phase is Phase.PENDING
    assert "evil" not in state.bundles or state.bundle("evil").pending is None
    assert [p.name for p in host.store.iterdir()] == [outcomes["nvidia"].generation]

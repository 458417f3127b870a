"""The real NVIDIA driver through modstage's host side: stage, intake, verify.

Each Debian release's driver against its own kernel (535 against Debian 12's 6.1, 550
against Debian 13's 6.12; five modules, ``nvidia.ko`` 65 and 88 MB once stripped as DKMS
strips it) and its GSP firmware are staged as the GPU operator's driver container would
(``modstage stage`` with its ``<module>.conf`` parameter files), taken in against that
kernel whole (vmlinuz and the in-tree modules: ``nvidia-drm`` imports from ``drm``), and
judged by ``modstage verify --json``. Expectations come from kmod's ``modinfo`` and the
build's own ``Module.symvers``, never from numbers written here.
"""

from __future__ import annotations

import hashlib
import io
import json
import subprocess
import tomllib
from pathlib import Path
from typing import Any, NamedTuple

import pytest

from service.bundles.phase import Phase
from service.bundles.statefile import load
from service.cli import main
from service.config import Config
from service.layout import Layout
from tests.nvidia import PARAMS, Driver

#: The example config's ``[bundles.nvidia]``, the policy the host takes the driver in under.
SHIPPED = Path(__file__).resolve().parents[2] / "deploy" / "config.example.toml"


def modinfo(path: Path, field: str) -> list[str]:
    """kmod's ``modinfo -F field``: one value a line (empty list: none)."""
    out = subprocess.run(
        ["modinfo", "-F", field, str(path)], capture_output=True, text=True, check=True
    ).stdout
    return [line for line in out.splitlines() if line]


def depends(path: Path) -> set[str]:
    """kmod's ``depends`` of a module: one comma-separated value, maybe empty."""
    return {d for d in ",".join(modinfo(path, "depends")).split(",") if d}


def sha256(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        while chunk := f.read(1 << 20):
            h.update(chunk)
    return h.hexdigest()


class TakenIn(NamedTuple):
    """One staged and taken-in real driver bundle."""

    host: Layout
    drop_manifest: dict[str, Any]  # manifest.toml of the drop, as staged
    code: int  # modstage intake's exit code
    output: str
    verify_drop: list[dict[str, Any]]  # modstage verify --json of the drop, before intake


def _cli(*argv: str) -> tuple[int, str]:
    out = io.StringIO()
    return main(list(argv), out), out.getvalue()


@pytest.fixture(scope="module")
def taken_in(
    real_host: Layout,
    signed: dict[str, Path],
    firmware: Path,
    driver: Driver,
    tmp_path_factory: pytest.TempPathFactory,
) -> TakenIn:
    """``modstage stage`` the signed modules (load order), the operator's parameter files
    and the GSP firmware; ``modstage verify --json`` the drop; ``modstage intake`` it under
    the example config's ``[bundles.nvidia]``: its module and parameter globs must admit the
    driver and the operator's parameters, and against the kernel's whole tree none of the
    driver's modules may be named like one of the kernel's own."""
    params = tmp_path_factory.mktemp("drivers")
    for name, text in PARAMS.items():
        (params / f"{name}.conf").write_text(text)
    argv = ["stage", "--into", str(real_host.incoming), "--bundle", "nvidia"]
    argv += ["--version", driver.version, "--kernel", driver.kernel, "--params-dir", str(params)]
    argv += [arg for ko in signed.values() for arg in ("--module", str(ko))]
    code, out = _cli(*argv, "--firmware", str(firmware))
    assert code == 0, out
    drop = Path(out.strip().splitlines()[-1])
    manifest = tomllib.loads((drop / "manifest.toml").read_text())
    common = ["--root", str(real_host.root), "--kernel", driver.kernel]
    _, verified = _cli("verify", "--json", *common, str(drop))
    policy = tomllib.loads(SHIPPED.read_text())["bundles"]["nvidia"]
    real_host.config.parent.mkdir(parents=True, exist_ok=True)
    table = "".join(f"{key} = {json.dumps(value)}\n" for key, value in policy.items())
    real_host.config.write_text("[bundles.nvidia]\n" + table)
    code, output = _cli("intake", "--root", str(real_host.root), str(drop))
    return TakenIn(real_host, manifest, code, output, json.loads(verified))


def test_stage_writes_every_module_parameter_and_firmware_file(
    taken_in: TakenIn, signed: dict[str, Path], firmware: Path
) -> None:
    """The drop lists the five modules in load order with the operator files' parameters
    (lines joined), each a parameter the module declares, and every GSP firmware file at
    its path below the firmware directory, with the digests of the sources."""
    manifest = taken_in.drop_manifest
    assert [Path(m["file"]).name for m in manifest["module"]] == [f"{n}.ko" for n in signed]
    for entry, (name, ko) in zip(manifest["module"], signed.items(), strict=True):
        assert entry["sha256"] == sha256(ko)
        given = PARAMS.get(name, "").split()
        assert entry.get("params", "").split() == given
        declared = {p.split(":", 1)[0] for p in modinfo(ko, "parm")}
        assert {p.split("=", 1)[0] for p in given} <= declared
    blobs = sorted(p for p in firmware.rglob("*") if p.is_file())
    assert len(blobs) >= 2  # gsp_tu10x.bin and gsp_ga10x.bin at least
    listed = {f["file"]: f["sha256"] for f in manifest["firmware"]}
    assert listed == {"firmware/" + p.relative_to(firmware).as_posix(): sha256(p) for p in blobs}


def test_intake_takes_the_real_driver_in_as_a_pending_generation(
    taken_in: TakenIn, signed: dict[str, Path], firmware: Path
) -> None:
    """Intake accepts the bundle under the example config's policy: one pending ``nvidia``
    generation whose stored modules and firmware are byte-for-byte the signed modules and
    the package's firmware, read-only."""
    assert taken_in.code == 0, taken_in.output
    assert "pending nvidia generation" in taken_in.output
    bundle = load(taken_in.host.state).bundle("nvidia")
    assert bundle.phase is Phase.PENDING and bundle.pending
    stored = taken_in.host.store / str(bundle.pending)
    for name, ko in signed.items():
        assert sha256(stored / "modules" / f"{name}.ko") == sha256(ko)
    for blob in (p for p in firmware.rglob("*") if p.is_file()):
        copy = stored / "firmware" / blob.relative_to(firmware)
        assert copy.stat().st_size == blob.stat().st_size and sha256(copy) == sha256(blob)
    assert all(not p.stat().st_mode & 0o222 for p in stored.rglob("*") if p.is_file())
    status = json.loads((taken_in.host.status / "nvidia.json").read_text())
    assert status["phase"] == "pending"


def test_the_gsp_firmware_is_what_nvidia_declares_and_needs_no_host_table(
    taken_in: TakenIn, signed: dict[str, Path], firmware: Path, driver: Driver
) -> None:
    """Every firmware file the bundle ships is a name ``nvidia.ko`` declares (kmod's
    ``modinfo -F firmware``: ``nvidia/<version>/gsp_*.bin``), no other module declares any,
    and the real host's ``[bundles.nvidia]`` (the example config's) allows no firmware: the
    driver passes intake's firmware rule by its own declarations."""
    declared = {name: set(modinfo(ko, "firmware")) for name, ko in signed.items()}
    shipped = {p.relative_to(firmware).as_posix() for p in firmware.rglob("*") if p.is_file()}
    assert shipped == declared["nvidia"], (shipped, declared["nvidia"])
    assert all(n.startswith(f"nvidia/{driver.version.split('-')[0]}/") for n in shipped)
    assert not any(declared[name] for name in signed if name != "nvidia")
    policy = Config.load(taken_in.host.config).bundle_policy("nvidia")
    assert policy.firmware == policy.firmware_override == ()
    assert taken_in.code == 0, taken_in.output


def test_verify_json_of_the_drop_accepts_every_module_as_kmod_reads_it(
    taken_in: TakenIn, signed: dict[str, Path], nvidia_key: Any
) -> None:
    """``modstage verify --json`` of the drop: every file ok, every module ok (signature,
    vermagic, every import resolved with its CRC, in load order), signed by the session's key
    with sha256,
    and its name, vermagic, srcversion, depends, firmware and PCI aliases equal kmod
    modinfo's (``nvidia`` has PCI aliases: the devices boot and status match it against)."""
    assert all(v["ok"] for v in taken_in.verify_drop), taken_in.verify_drop
    modules = [v for v in taken_in.verify_drop if v["file"].endswith(".ko")]
    assert [Path(v["file"]).name for v in modules] == [f"{n}.ko" for n in signed]
    for verdict, ko in zip(modules, signed.values(), strict=True):
        assert verdict["ok"], verdict["reason"]
        assert (verdict["signer"], verdict["hash"]) == ("modstage nvidia", "sha256")
        assert verdict["signer"] == modinfo(ko, "signer")[0]
        assert verdict["name"] == modinfo(ko, "name")[0]
        assert verdict["vermagic"] == modinfo(ko, "vermagic")[0]
        assert [v for v in [verdict["srcversion"]] if v] == modinfo(ko, "srcversion")
        assert set(verdict["depends"]) == depends(ko)
        assert verdict["firmware"] == modinfo(ko, "firmware")
        assert verdict["pci"] == [a for a in modinfo(ko, "alias") if a.startswith("pci:")]
        assert verdict["sha256"] == sha256(ko)
    assert modules[0]["pci"], "nvidia.ko names the PCI devices it is for"


def test_each_module_alone_is_judged_by_where_its_dependencies_live(
    real_host: Layout, signed: dict[str, Path], driver: Driver
) -> None:
    """Verified one file at a time, a module whose ``depends`` (kmod's) are all in-tree is
    accepted (the in-tree modules are loaded by modprobe first), and one depending on a
    module of the bundle is refused with the kernel's ENOENT "Unknown symbol", naming a
    symbol that the bundle module exports (its build's Module.symvers)."""
    bundle = {ko.stem.replace("-", "_") for ko in signed.values()}
    owned: dict[str, str] = {}
    for line in driver.symvers.read_text().splitlines():
        _crc, symbol, owner, *_ = line.split("\t")
        owned[symbol] = Path(owner).name.replace("-", "_")
    verdicts = [
        json.loads(_cli(
            "verify", "--json", "--root", str(real_host.root), "--kernel", driver.kernel, str(ko)
        )[1])[0]
        for ko in signed.values()
    ]  # fmt: skip
    for verdict, ko in zip(verdicts, signed.values(), strict=True):
        needs = {d.replace("-", "_") for d in depends(ko)}  # one module name, two spellings
        if needs & bundle:
            assert not verdict["ok"] and verdict["errno"] == "ENOENT", verdict
            symbol = verdict["reason"].split("Unknown symbol ", 1)[1].split()[0]
            assert owned[symbol] in needs & bundle
        else:
            assert verdict["ok"], verdict["reason"]


def test_every_crc_the_modules_carry_is_the_one_their_export_has(
    taken_in: TakenIn, signed: dict[str, Path], driver: Driver
) -> None:
    """What the accepted verdicts rest on, read with kmod and the build's files alone: each
    ``__versions`` entry (``modprobe --dump-modversions``) names a symbol the kernel's
    headers (``Module.symvers``) or the driver's own build export, with that same CRC."""
    exported: dict[str, int] = {}
    symvers = taken_in.host.root / f"lib/modules/{driver.kernel}/build/Module.symvers"
    for table in (symvers, driver.symvers):
        for line in table.read_text().splitlines():
            crc, symbol, *_ = line.split("\t")
            exported[symbol] = int(crc, 16)
    for ko in signed.values():
        dump = subprocess.run(
            ["modprobe", "--dump-modversions", str(ko)], capture_output=True, text=True, check=True
        ).stdout.splitlines()
        assert dump, ko
        carried = {name: int(crc, 16) for crc, name in (line.split("\t") for line in dump)}
        assert {n: exported.get(n) for n in carried} == carried, ko.name


def test_the_modules_named_together_are_judged_as_one_bundle_in_the_order_given(
    real_host: Layout, signed: dict[str, Path], driver: Driver
) -> None:
    """Named together in the build's order (``nvidia`` first) the driver's modules verify
    as a set, as intake takes them in; named with ``nvidia`` last, each module whose
    ``depends`` (kmod's) names it is refused with ENOENT naming ``nvidia``'s file."""
    argv = ["verify", "--json", "--root", str(real_host.root), "--kernel", driver.kernel]
    code, out = _cli(*argv, *map(str, signed.values()))
    assert code == 0, [v["reason"] for v in json.loads(out) if not v["ok"]]
    last = [*list(signed.values())[1:], signed["nvidia"]]
    code, out = _cli(*argv, *map(str, last))
    for verdict, ko in zip(json.loads(out), last, strict=True):
        if "nvidia" in depends(ko):
            assert verdict["errno"] == "ENOENT", verdict
            assert f"depends on nvidia ({signed['nvidia']})" in verdict["reason"]
        else:
            assert verdict["ok"], verdict["reason"]
    assert code == 1

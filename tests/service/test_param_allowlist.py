"""A bundle's ``params``: where it names globs, every parameter a drop's modules set must
match one, beside the host's ``forbidden_params``, which no bundle may set.

The pure rule (:func:`service.intake.bundlerules.unlisted_params`) with plain manifest
entries, the key's checks, then intake with the real signed ``ms_params`` (parameters
``count`` and ``label``).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from service.config import BundlePolicy, Config
from service.errors import ConfigError
from service.intake.bundlerules import unlisted_params
from service.layout import Layout
from stager.drop import ModuleSpec, stage
from stager.schema.manifest import ModuleEntry
from tests.service.fakes import make_intake

NVIDIA = BundlePolicy(params=("NVreg_*", "uvm-*", "modeset"))


def unlisted(policy: BundlePolicy, **params: str) -> list[str]:
    modules = [ModuleEntry(f"modules/{name}.ko", "0" * 64, text) for name, text in params.items()]
    return unlisted_params(modules, "nvidia", policy)


def test_a_parameter_no_glob_matches_is_refused_naming_file_parameter_and_globs() -> None:
    """Each parameter no glob of ``params`` matches is one problem naming the module's file,
    the parameter and the globs; those the globs match pass."""
    assert unlisted(
        NVIDIA,
        nvidia="NVreg_EnableGpuFirmware=1 NVreg_DeviceFileMode=0660",
        nvidia_drm="modeset=1 fbdev=1",
        nvidia_uvm="uvm_perf_prefetch_enable=1",
    ) == [
        "modules/nvidia_drm.ko: parameter fbdev matches none of [bundles.nvidia] params = "
        '["NVreg_*", "uvm-*", "modeset"]'
    ]


def test_dashes_and_underscores_are_one_parameter_name_and_case_counts() -> None:
    """``-`` and ``_`` are the same in a parameter name (the kernel's ``parameq``), in the
    name and the glob alike; case is not: ``nvreg_x`` is no ``NVreg_*``."""
    assert unlisted(NVIDIA, uvm="uvm-perf=1 uvm_perf=2", drm="mode-set=1") == [
        "modules/drm.ko: parameter mode-set matches none of [bundles.nvidia] params = "
        '["NVreg_*", "uvm-*", "modeset"]'
    ]
    assert unlisted(BundlePolicy(params=("mode-set",)), drm="mode_set=1") == []
    assert len(unlisted(NVIDIA, nvidia="nvreg_x=1")) == 1


def test_without_params_any_parameter_is_taken() -> None:
    """An empty ``params`` allows every name (``forbidden_params`` still applies)."""
    assert unlisted(BundlePolicy(), nvidia="anything=1 at_all") == []


def test_params_is_checked_like_every_key() -> None:
    """``params`` is an array of non-empty globs; a problem names the key and the value."""
    with pytest.raises(ConfigError) as info:
        Config.from_dict({"bundles": {"demo": {"params": ["NVreg_*", ""]}}})
    assert info.value.problems == ("bundles.demo.params: '' is an empty glob",)
    with pytest.raises(ConfigError) as info:
        Config.from_dict({"bundles": {"demo": {"params": "NVreg_*"}}})
    assert info.value.problems == ("bundles.demo.params: 'NVreg_*' is not an array of strings",)
    config = Config.from_dict({"bundles": {"demo": {"params": ["NVreg_*"]}}})
    assert config.bundle_policy("demo") == BundlePolicy(params=("NVreg_*",))


# intake, with a real module


def _stage(host: Layout, kernel: str, module: Path, params: str) -> None:
    stage(
        host.incoming,
        bundle="demo",
        version="1",
        kernel=kernel,
        modules=[ModuleSpec(module, params)],
    )


def test_intake_refuses_a_parameter_the_bundle_does_not_list(
    host: Layout, module: Path, kernel: str
) -> None:
    """With ``params = ["count"]``, ``ms_params`` setting ``label`` too is rejected before
    anything is copied, naming the file, the parameter and the globs; with ``label`` listed
    as well it is taken in."""
    only_count = Config.from_dict({"bundles": {"demo": {"params": ["count"]}}})
    _stage(host, kernel, module, "count=42 label=x")
    [outcome] = make_intake(host, only_count).run()
    assert outcome.reasons == (
        'modules/ms_params.ko: parameter label matches none of [bundles.demo] params = ["count"]',
    )
    assert not any(host.store.glob("*"))  # nothing copied
    _stage(host, kernel, module, "count=42 label=x")
    both = Config.from_dict({"bundles": {"demo": {"params": ["count", "label"]}}})
    [outcome] = make_intake(host, both).run()
    assert outcome.accepted, outcome.reasons


def test_a_listed_parameter_the_host_forbids_is_still_refused(
    host: Layout, module: Path, kernel: str
) -> None:
    """``forbidden_params`` wins over a bundle's ``params``: ``count`` matched by ``*`` but
    forbidden is refused as forbidden."""
    config = Config.from_dict(
        {"forbidden_params": ["count"], "bundles": {"demo": {"params": ["*"]}}}
    )
    _stage(host, kernel, module, "count=42")
    [outcome] = make_intake(host, config).run()
    assert outcome.reasons == ("module[0].params: 'count' is forbidden on this host",)

"""A bundle's ``min_version``: intake refuses a drop whose version orders below it (Debian's
version order), naming both versions; an admin's rollback below it stands, and the pod of
the driver rolled back to may stage it again.

The pure rule (:func:`service.intake.bundlerules.below_floor`) with plain versions, the key's
checks, then intake and ``modstage rollback`` on a test host with real signed modules.
"""

from __future__ import annotations

import io
from pathlib import Path

import pytest

from service.bundles.statefile import load
from service.cli import main
from service.config import BundlePolicy, Config
from service.errors import ConfigError
from service.intake.bundlerules import below_floor
from service.layout import Layout
from stager.drop import ModuleSpec, stage
from tests.service.fakes import make_intake, pending


def floor(version: str, minimum: str | None) -> str | None:
    return below_floor(version, "nvidia", BundlePolicy(min_version=minimum))


@pytest.mark.parametrize(
    ("version", "minimum"),
    [
        ("535.261.03", "550.0"),
        ("550.54.14", "550.163.01"),  # numerically, not as text
        ("550.0~rc1", "550.0"),  # ~ sorts before the end
        ("9:1.0", "10:0"),  # the epoch first
        ("550", "550.0"),
    ],
)
def test_a_version_below_the_floor_is_named_with_the_floor(version: str, minimum: str) -> None:
    """Below ``min_version`` by dpkg's order: one problem naming both versions; at or above
    it (the same pair the other way round), none."""
    assert floor(version, minimum) == (
        f'version {version} orders below [bundles.nvidia] min_version = "{minimum}" '
        "(Debian's version order)"
    )
    assert floor(minimum, version) is None
    assert floor(minimum, minimum) is None


def test_without_a_floor_every_version_is_taken() -> None:
    """No ``min_version``: no version is below it."""
    assert floor("0", None) is None


def test_min_version_is_checked_like_every_key() -> None:
    """``min_version`` is a plain token, as a manifest's version is; a problem names the key
    and the value."""
    with pytest.raises(ConfigError) as info:
        Config.from_dict({"bundles": {"demo": {"min_version": "5 50"}}})
    assert info.value.problems == (
        "bundles.demo.min_version: '5 50' is not a plain token (letters, digits, '.', '_', "
        "'+', '~', ':', '-'; at most 128)",
    )
    with pytest.raises(ConfigError) as info:
        Config.from_dict({"bundles": {"demo": {"min_version": 550}}})
    assert info.value.problems[0].startswith("bundles.demo.min_version: 550 is not a string")
    config = Config.from_dict({"bundles": {"demo": {"min_version": "550.0"}}})
    assert config.bundle_policy("demo").min_version == "550.0"


# intake and the admin's rollback, with real modules


def _stage(host: Layout, kernel: str, module: Path, version: str, bundle: str = "demo") -> None:
    stage(
        host.incoming,
        bundle=bundle,
        version=version,
        kernel=kernel,
        modules=[ModuleSpec(module, "")],
    )


def _floor(host: Layout, version: str) -> Config:
    """``[bundles.demo] min_version = version`` in the host's config.toml, as loaded."""
    host.config.parent.mkdir(parents=True, exist_ok=True)
    host.config.write_text(f'[bundles.demo]\nmin_version = "{version}"\n')
    return Config.load(host.config)


def test_intake_refuses_a_drop_below_the_floor_naming_both_versions(
    host: Layout, signed: dict[str, Path], kernel: str
) -> None:
    """With ``min_version = "550.0"``, a drop of 535.261.03 is rejected before anything is
    copied, naming both versions; 550.0 itself, and another bundle's 1, are taken in."""
    config = _floor(host, "550.0")
    module = signed["ms_params"]
    _stage(host, kernel, module, "535.261.03")
    [outcome] = make_intake(host, config).run()
    assert outcome.reasons == (
        'version 535.261.03 orders below [bundles.demo] min_version = "550.0" '
        "(Debian's version order)",
    )
    assert not any(host.store.glob("*"))  # nothing copied
    _stage(host, kernel, module, "550.0")
    _stage(host, kernel, signed["ms_exporter"], "1", bundle="other")
    outcomes = make_intake(host, config).run()
    assert [o.accepted for o in outcomes] == [True, True], [o.reasons for o in outcomes]


def test_a_retained_generation_below_the_floor_is_refused_when_staged_again(
    host: Layout, module: Path, kernel: str
) -> None:
    """Versions 1 and 2 taken in before the floor was set; with ``min_version = "2"`` a drop
    of 1 again (a generation the store keeps, neither active nor pending) is refused."""
    pending(host, kernel, [(module, "")], version="1", bundle="demo")
    pending(host, kernel, [(module, "")], version="2", bundle="demo")
    config = _floor(host, "2")
    _stage(host, kernel, module, "1")
    [outcome] = make_intake(host, config).run()
    assert not outcome.accepted
    assert outcome.reasons[0].startswith('version 1 orders below [bundles.demo] min_version = "2"')


def test_an_admins_rollback_below_the_floor_stands_and_may_be_staged_again(
    host: Layout, module: Path, kernel: str
) -> None:
    """With ``min_version = "2"``, ``modstage rollback`` to version 1 succeeds and its note
    says the version is below the floor; the drop of version 1 the rolled-back driver's pod
    makes again is taken in (the generation is the pending one), not refused."""
    v1 = pending(host, kernel, [(module, "")], version="1", bundle="demo")
    pending(host, kernel, [(module, "")], version="2", bundle="demo")
    config = _floor(host, "2")
    out = io.StringIO()
    code = main(["rollback", "--root", str(host.root), "demo", v1[:12]], out)
    assert code == 0, out.getvalue()
    assert out.getvalue().startswith(
        'demo: rollback recorded; version 1 orders below [bundles.demo] min_version = "2" '
        "(Debian's version order): a drop of it would be refused, the rollback is not; "
    ), out.getvalue()
    assert load(host.state).bundle("demo").pending == v1
    _stage(host, kernel, module, "1")
    [outcome] = make_intake(host, config).run()
    assert outcome.accepted and outcome.generation == v1, outcome.reasons

"""A bundle's drops carry no module in the place of one of the target kernel's own unless its
``[bundles.<name>]`` table allows that name, and where the table names module globs, only
modules they match.

The pure rule (:mod:`service.intake.bundlerules`) with plain values, the table's checks, then
intake with real signed modules: the test host's tree for the target kernel has Debian's
``kernel/lib/crc8.ko`` and ``modules.builtin``; a test adds ``ms_params`` to its
``modules.dep`` or ``modules.builtin`` to make that module one of the kernel's own.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from service.config import BundlePolicy, Config
from service.errors import ConfigError
from service.intake.bundlerules import name_problems
from service.layout import Layout, modules_dir
from stager.drop import ModuleSpec, stage
from tests.service.fakes import make_intake

NONE = BundlePolicy()
TREE = {"crc8": "/lib/modules/6.1.0-57-amd64/kernel/lib/crc8.ko"}


def shadows(
    modules: list[tuple[str, str]],
    policy: BundlePolicy = NONE,
    builtin: frozenset[str] = frozenset({"ext4"}),
) -> list[str]:
    return name_problems(modules, bundle="demo", policy=policy, in_tree=TREE.get, builtin=builtin)


def test_a_module_named_like_an_in_tree_module_is_refused_naming_file_module_and_key() -> None:
    """A drop module whose name the target's tree has is one problem naming the drop's
    file, the in-tree module's path and the key that allows it; a module of another name
    beside it passes."""
    assert shadows([("modules/crc8.ko", "crc8"), ("modules/nvidia.ko", "nvidia")]) == [
        "modules/crc8.ko: module crc8 would take the place of the target kernel's in-tree "
        "module /lib/modules/6.1.0-57-amd64/kernel/lib/crc8.ko; [bundles.demo] "
        "shadow_in_tree does not name it"
    ]


def test_a_module_named_like_a_built_in_one_is_refused() -> None:
    """A name ``modules.builtin`` lists is refused as built in."""
    assert shadows([("modules/fs.ko", "ext4")]) == [
        "modules/fs.ko: module ext4 would take the place of the target kernel's module ext4, "
        "built in (modules.builtin); [bundles.demo] shadow_in_tree does not name it"
    ]


@pytest.mark.parametrize("name", ["crc-8", "crc_8"])
def test_dashes_and_underscores_are_one_name(name: str) -> None:
    """``-`` and ``_`` are the same to the kernel: ``crc-8`` and ``crc_8`` both take the
    place of an in-tree ``crc_8``, and a glob spelled with either allows both."""
    tree = {"crc_8": "/lib/modules/r/kernel/lib/crc-8.ko"}.get
    for glob, found in (((), 1), (("crc-8",), 0), (("crc_*",), 0)):
        policy = BundlePolicy(shadow_in_tree=glob)
        problems = name_problems(
            [("m.ko", name)], bundle="demo", policy=policy, in_tree=tree, builtin=()
        )
        assert len(problems) == found, (glob, problems)


def test_shadow_in_tree_allows_the_names_its_globs_match() -> None:
    """``shadow_in_tree`` globs admit the in-tree and built-in names they match, and only
    those."""
    allow = BundlePolicy(shadow_in_tree=("crc*", "ext[0-9]"))
    assert shadows([("a.ko", "crc8"), ("b.ko", "ext4")], allow) == []
    assert len(shadows([("a.ko", "crc8")], BundlePolicy(shadow_in_tree=("ext4",)))) == 1


def test_a_module_no_glob_of_modules_matches_is_refused_naming_file_and_globs() -> None:
    """With ``modules`` set, a module no glob matches is one problem naming the file and the
    globs; the modules they match pass, ``-`` and ``_`` alike."""
    policy = BundlePolicy(modules=("nvidia", "nvidia-*"))
    names = [("modules/nvidia.ko", "nvidia"), ("modules/uvm.ko", "nvidia-uvm")]
    assert shadows([*names, ("modules/helper.ko", "helper")], policy) == [
        "modules/helper.ko: module helper matches none of [bundles.demo] modules = "
        '["nvidia", "nvidia-*"]'
    ]


def test_without_modules_any_name_is_taken_and_both_rules_apply_together() -> None:
    """An empty ``modules`` takes any name not in-tree; a module both outside the globs and
    in-tree gets both problems."""
    assert shadows([("a.ko", "anything")]) == []
    both = shadows([("a.ko", "crc8")], BundlePolicy(modules=("nvidia",)))
    assert len(both) == 2 and "matches none of" in both[0] and "would take the place" in both[1]


@pytest.mark.parametrize("key", ["shadow_in_tree", "modules"])
def test_the_name_globs_are_checked_like_every_key(key: str) -> None:
    """``shadow_in_tree`` and ``modules`` are arrays of non-empty globs; a problem names the
    key and the value."""
    with pytest.raises(ConfigError) as info:
        Config.from_dict({"bundles": {"demo": {key: [""]}, "b": {"x": 1}}})
    assert sorted(info.value.problems) == [
        "bundles.b.x: unknown key",
        f"bundles.demo.{key}: '' is an empty glob",
    ]
    with pytest.raises(ConfigError) as info:
        Config.from_dict({"bundles": {"demo": {key: "crc8"}}})
    assert info.value.problems == (f"bundles.demo.{key}: 'crc8' is not an array of strings",)
    config = Config.from_dict({"bundles": {"demo": {key: ["crc8"]}}})
    assert config.bundle_policy("demo") == BundlePolicy(**{key: ("crc8",)})


# intake, with real modules


def _stage(host: Layout, kernel: str, module: Path, bundle: str = "demo") -> Path:
    return stage(
        host.incoming, bundle=bundle, version="1", kernel=kernel, modules=[ModuleSpec(module, "")]
    )


def _listed(host: Layout, release: str, listing: str, line: str) -> None:
    """``line`` added to the tree of ``release``'s ``listing`` (``modules.dep``,
    ``modules.builtin``)."""
    path = modules_dir(host, release) / listing
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a") as f:
        f.write(line + "\n")


def test_intake_refuses_a_module_the_target_tree_lists_unless_the_bundle_may_shadow_it(
    host: Layout, signed: dict[str, Path], kernel: str
) -> None:
    """With ``kernel/misc/ms_params.ko`` in the target's ``modules.dep``, a drop carrying
    ``ms_params`` is rejected before any generation exists, naming the file, the tree's
    path and the key; the same drop is taken in once ``shadow_in_tree`` names it."""
    _listed(host, kernel, "modules.dep", "kernel/misc/ms_params.ko:")
    _stage(host, kernel, signed["ms_params"])
    [outcome] = make_intake(host).run()
    assert outcome.reasons == (
        f"modules/ms_params.ko: module ms_params would take the place of the target "
        f"kernel's in-tree module /lib/modules/{kernel}/kernel/misc/ms_params.ko; "
        "[bundles.demo] shadow_in_tree does not name it",
    )
    assert list(host.store.iterdir()) == []
    _stage(host, kernel, signed["ms_params"])
    allow = Config.from_dict({"bundles": {"demo": {"shadow_in_tree": ["ms_*"]}}})
    [outcome] = make_intake(host, allow).run()
    assert outcome.accepted, outcome.reasons


def test_intake_refuses_a_built_in_name_and_another_bundles_allowance_does_not_count(
    host: Layout, signed: dict[str, Path], kernel: str
) -> None:
    """A name in the target's ``modules.builtin`` is refused as built in, also when another
    bundle's table allows it."""
    _listed(host, kernel, "modules.builtin", "kernel/misc/ms_params.ko")
    _stage(host, kernel, signed["ms_params"])
    other = Config.from_dict({"bundles": {"other": {"shadow_in_tree": ["*"]}}})
    [outcome] = make_intake(host, other).run()
    assert outcome.reasons == (
        "modules/ms_params.ko: module ms_params would take the place of the target kernel's "
        "module ms_params, built in (modules.builtin); [bundles.demo] shadow_in_tree does "
        "not name it",
    )


def test_the_name_is_the_one_the_kernel_registers_not_the_files(
    host: Layout, signed: dict[str, Path], kernel: str, tmp_path: Path
) -> None:
    """A file named ``crc8.ko`` (an in-tree name) holding ``ms_params`` is taken in: the
    kernel registers it as ``ms_params``; a file of another name holding a module the tree
    lists is refused under the module's name."""
    crc8 = tmp_path / "crc8.ko"
    crc8.write_bytes(signed["ms_params"].read_bytes())
    _stage(host, kernel, crc8)
    [outcome] = make_intake(host).run()
    assert outcome.accepted, outcome.reasons
    _listed(host, kernel, "modules.dep", "kernel/misc/ms_exporter.ko:")
    other = tmp_path / "vendor-helper.ko"
    other.write_bytes(signed["ms_exporter"].read_bytes())
    _stage(host, kernel, other, bundle="other")
    [outcome] = make_intake(host).run()
    assert [r.split(":")[0] for r in outcome.reasons] == ["modules/vendor-helper.ko"]
    assert "module ms_exporter would take the place" in outcome.reasons[0]


def test_out_of_tree_modules_and_other_kernels_trees_do_not_count(
    host: Layout, signed: dict[str, Path], kernel: str
) -> None:
    """``ms_params`` under the target's ``updates/`` (modules.dep lists it, a file is
    there) and in another kernel's tree is not the target kernel's own: taken in."""
    _listed(host, kernel, "modules.dep", "updates/dkms/ms_params.ko:")
    (modules_dir(host, kernel) / "updates/dkms").mkdir(parents=True)
    (modules_dir(host, kernel) / "updates/dkms/ms_params.ko").write_bytes(b"")
    _listed(host, "6.1.0-99-amd64", "modules.dep", "kernel/misc/ms_params.ko:")
    _listed(host, "6.1.0-99-amd64", "modules.builtin", "kernel/misc/ms_params.ko")
    _stage(host, kernel, signed["ms_params"])
    [outcome] = make_intake(host).run()
    assert outcome.accepted, outcome.reasons


def test_intake_takes_only_the_modules_the_bundles_globs_match(
    host: Layout, signed: dict[str, Path], kernel: str, tmp_path: Path
) -> None:
    """With ``[bundles.demo] modules = ["ms_exporter"]``, a drop carrying ``ms_params`` is
    rejected naming the file and the globs, also in a file named ``ms_exporter.ko`` (the
    kernel registers ``ms_params``); ``ms_exporter`` itself is taken in, and another
    bundle's drop carrying ``ms_params`` too."""
    only = Config.from_dict({"bundles": {"demo": {"modules": ["ms_exporter"]}}})
    disguised = tmp_path / "ms_exporter.ko"
    disguised.write_bytes(signed["ms_params"].read_bytes())
    for module in (signed["ms_params"], disguised):
        _stage(host, kernel, module)
        [outcome] = make_intake(host, only).run()
        assert outcome.reasons == (
            f"modules/{module.name}: module ms_params matches none of [bundles.demo] "
            'modules = ["ms_exporter"]',
        )
    _stage(host, kernel, signed["ms_exporter"])
    _stage(host, kernel, signed["ms_params"], bundle="other")
    outcomes = make_intake(host, only).run()
    assert [o.accepted for o in outcomes] == [True, True], [o.reasons for o in outcomes]

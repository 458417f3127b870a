"""A drop carries only firmware its own modules declare, or the host allows, and shadows
nothing of the host's firmware unless the host allows that bundle to.

The pure rule (:func:`service.intake.firmware_names.firmware_problems`) with plain values, then
intake with real signed modules: ``ms_firmware`` declares ``modstage/test.bin``
(``MODULE_FIRMWARE``), ``ms_exporter`` declares nothing.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from service.config import BundlePolicy, Config
from service.errors import ConfigError
from service.intake.firmware_names import firmware_problems, requested_path
from service.layout import Layout
from service.verify.targetkernel.kconfig import KernelConfig
from service.verify.targetkernel.kernel import Target
from stager.drop import ModuleSpec, stage
from tests.service.fakes import make_intake

NONE = BundlePolicy()
ALL = ("", ".zst", ".xz")  # the loader's suffixes, in its order, on Debian's 6.12


def _nothing(_name: str) -> str | None:
    return None


def _host(*names: str) -> object:
    return lambda name: f"/lib/firmware/{name}" if name in names else None


def problems(
    files: list[str],
    declared: list[str],
    policy: BundlePolicy = NONE,
    host: object = _nothing,
    suffixes: tuple[str, ...] = ("", ".xz"),
) -> list[str]:
    return firmware_problems(
        files,
        declared,
        bundle="demo",
        policy=policy,
        host_file=host,  # type: ignore[arg-type]
        suffixes=suffixes,
    )


def test_an_undeclared_file_is_refused_naming_the_file_and_the_rule() -> None:
    """A file no module of the drop declares, and the bundle's allowlist does not name, is
    refused: one problem naming the file and the rule; a declared file beside it passes."""
    assert problems(
        ["firmware/nvidia/1/gsp.bin", "firmware/rtl_nic/rtl8168h-2.fw"], ["nvidia/1/gsp.bin"]
    ) == [
        "firmware/rtl_nic/rtl8168h-2.fw: not declared by any module of the drop "
        "(MODULE_FIRMWARE) and not in [bundles.demo] firmware"
    ]


def test_the_allowlist_admits_an_undeclared_name_by_glob() -> None:
    """``[bundles.<name>] firmware`` globs admit undeclared names (``*`` crosses ``/``);
    a name it does not match is still refused."""
    allow = BundlePolicy(firmware=("vendor/*",))
    assert problems(["firmware/vendor/a/b.bin"], [], allow) == []
    assert len(problems(["firmware/other/b.bin"], [], allow)) == 1


@pytest.mark.parametrize(
    ("declared", "opened"),
    [
        ("nvidia/1/gsp.bin", "nvidia/1/gsp.bin"),
        ("/nvidia/1/gsp.bin", "nvidia/1/gsp.bin"),
        ("nvidia//1/./gsp.bin", "nvidia/1/gsp.bin"),
        ("../nvidia/1/gsp.bin", None),
        ("nvidia/../nvidia/1/gsp.bin", None),
        ("nvidia/1/..", None),
        ("..", None),
        ("", None),
        ("/", None),
    ],
)
def test_a_declared_name_vouches_for_the_file_the_kernel_opens(
    declared: str, opened: str | None
) -> None:
    """The loader formats ``<dir>/<name>``: empty and ``.`` components and a leading ``/``
    open the same file, so such a name declares it; a name with a ``..`` component is
    refused by the loader (``name_contains_dotdot``) and an empty one is ``EINVAL``: they
    declare nothing."""
    assert requested_path(declared) == opened
    accepted = problems(["firmware/nvidia/1/gsp.bin"], [declared]) == []
    assert accepted == (opened == "nvidia/1/gsp.bin")


def test_a_compressed_file_answers_its_plain_name_only_where_the_loader_decompresses() -> None:
    """``gsp.bin.xz`` answers a request for ``gsp.bin`` when the target's loader tries
    ``.xz`` (``FW_LOADER_COMPRESS_XZ``): declared ``gsp.bin`` admits it; without ``.xz`` in
    the loader's suffixes it does not."""
    assert problems(["firmware/n/gsp.bin.xz"], ["n/gsp.bin"], suffixes=("", ".xz")) == []
    assert len(problems(["firmware/n/gsp.bin.xz"], ["n/gsp.bin"], suffixes=("",))) == 1


def test_a_name_the_host_provides_is_refused_unless_the_bundle_may_override_it() -> None:
    """A declared file whose name a host firmware directory also provides is refused,
    naming the host's file and the rule; ``firmware_override`` naming it admits it, and
    ``firmware`` (the allowlist) does not."""
    host = _host("rtl_nic/rtl8168h-2.fw")
    files, declared = ["firmware/rtl_nic/rtl8168h-2.fw"], ["rtl_nic/rtl8168h-2.fw"]
    assert problems(files, declared, host=host) == [
        "firmware/rtl_nic/rtl8168h-2.fw: the host provides /lib/firmware/rtl_nic/rtl8168h-2.fw; "
        "[bundles.demo] firmware_override does not name it"
    ]
    assert len(problems(files, declared, BundlePolicy(firmware=("rtl_nic/*",)), host)) == 1
    override = BundlePolicy(firmware_override=("rtl_nic/*",))
    assert problems(files, declared, override, host) == []


def test_a_host_file_the_loader_decompresses_is_shadowed_too() -> None:
    """The plain name is tried in every directory before any suffix, so a drop's ``x.bin``
    also replaces the host's ``x.bin.xz`` when the target decompresses xz; a drop's
    ``x.bin.xz`` replaces the host's ``x.bin.xz``."""
    host = _host("v/x.bin.xz")
    assert len(problems(["firmware/v/x.bin"], ["v/x.bin"], host=host)) == 1
    assert problems(["firmware/v/x.bin"], ["v/x.bin"], host=host, suffixes=("",)) == []
    assert len(problems(["firmware/v/x.bin.xz"], ["v/x.bin"], host=host)) == 1


@pytest.mark.parametrize(
    ("drop", "hosts", "refused"),
    [
        ("v/x.fw.zst", "v/x.fw.xz", True),  # the .zst pass finds the drop's file first
        ("v/x.fw.zst", "v/x.fw.zst", True),
        ("v/x.fw.zst", "v/x.fw", False),  # the plain pass finds the host's first
        ("v/x.fw.xz", "v/x.fw.zst", False),  # the .zst pass finds the host's first
        ("v/x.fw.xz", "v/x.fw.xz", True),
    ],
)
def test_a_compressed_file_shadows_the_hosts_forms_the_loader_tries_after_its_own(
    drop: str, hosts: str, refused: bool
) -> None:
    """The loader tries a request plain in every directory, then ``.zst`` in every one, then
    ``.xz``, the view first: a drop's ``x.fw.zst`` is loaded in place of the host's
    ``x.fw.zst`` and ``x.fw.xz``, never of its plain ``x.fw``; a drop's ``x.fw.xz`` never
    in place of the host's ``x.fw.zst``."""
    found = problems([f"firmware/{drop}"], ["v/x.fw"], host=_host(hosts), suffixes=ALL)
    assert found == (
        [
            f"firmware/{drop}: the host provides /lib/firmware/{hosts}; [bundles.demo] "
            "firmware_override does not name it"
        ]
        if refused
        else []
    )


def test_an_undeclared_file_the_host_provides_gets_both_problems() -> None:
    """Every problem is named: an undeclared name the host provides is refused twice."""
    assert len(problems(["firmware/rtl_nic/a.fw"], [], host=_host("rtl_nic/a.fw"))) == 2


def test_the_host_directories_are_the_loaders_in_its_order(tmp_path: Path) -> None:
    """``Layout.firmware_dirs`` is ``fw_path[]`` after ``firmware_class.path``: updates for
    the release, updates, the release's, then ``/lib/firmware``, under the root."""
    got = Layout(tmp_path).firmware_dirs("6.1.0-57-amd64")
    assert [p.relative_to(tmp_path).as_posix() for p in got] == [
        "lib/firmware/updates/6.1.0-57-amd64",
        "lib/firmware/updates",
        "lib/firmware/6.1.0-57-amd64",
        "lib/firmware",
    ]


def test_the_suffixes_are_the_targets_decompressors() -> None:
    """The loader's suffixes follow ``FW_LOADER_COMPRESS_ZSTD`` and ``_XZ`` (zstd tried
    first); an unknown config assumes both."""

    def target(text: str) -> Target:
        return Target.from_spec("6.1.0-57-amd64", KernelConfig.parse(text, "config"))

    assert target("CONFIG_FW_LOADER_COMPRESS_XZ=y\n").firmware_suffixes == ("", ".xz")
    both = "CONFIG_FW_LOADER_COMPRESS_XZ=y\nCONFIG_FW_LOADER_COMPRESS_ZSTD=y\n"
    assert target(both).firmware_suffixes == ("", ".zst", ".xz")
    assert target("").firmware_suffixes == ("",)
    assert Target.from_spec("6.1.0-57-amd64").firmware_suffixes == ("", ".zst", ".xz")


def test_bundle_tables_are_checked_like_every_key() -> None:
    """``[bundles.<name>]`` takes only ``firmware`` and ``firmware_override``, arrays of
    non-empty globs, under a bundle name a drop can use; each problem is named."""
    with pytest.raises(ConfigError) as info:
        Config.from_dict({"bundles": {"Bad.Name": {}, "demo": {"firmware": [""], "x": 1}, "b": 3}})
    assert sorted(info.value.problems) == sorted(
        [
            "bundles.Bad.Name: 'Bad.Name' is not a bundle name (no drop can use it)",
            "bundles.demo.x: unknown key",
            "bundles.demo.firmware: '' is an empty glob",
            "bundles.b: 3 is not a table",
        ]
    )
    config = Config.from_dict({"bundles": {"demo": {"firmware_override": ["a/*"]}}})
    assert config.bundle_policy("demo") == BundlePolicy(firmware_override=("a/*",))
    assert config.bundle_policy("other") == NONE


# intake, with real modules


def _stage(host: Layout, kernel: str, module: Path, firmware: Path, bundle: str = "demo") -> Path:
    return stage(
        host.incoming,
        bundle=bundle,
        version="1",
        kernel=kernel,
        modules=[ModuleSpec(module, "")],
        firmware_dirs=(firmware,),
    )


def _tree(root: Path, name: str) -> Path:
    (root / name).parent.mkdir(parents=True, exist_ok=True)
    (root / name).write_bytes(b"firmware " + name.encode())
    return root


def test_intake_refuses_firmware_no_module_of_the_drop_declares(
    host: Layout, signed: dict[str, Path], kernel: str, tmp_path: Path
) -> None:
    """A signed module that declares nothing cannot bring ``rtl_nic/rtl8168h-2.fw``: the
    drop is rejected before any generation exists, naming the file and the rule."""
    _stage(host, kernel, signed["ms_exporter"], _tree(tmp_path / "fw", "rtl_nic/rtl8168h-2.fw"))
    [outcome] = make_intake(host).run()
    assert not outcome.accepted
    assert outcome.reasons == (
        "firmware/rtl_nic/rtl8168h-2.fw: not declared by any module of the drop "
        "(MODULE_FIRMWARE) and not in [bundles.demo] firmware",
    )
    assert list(host.store.iterdir()) == []


def test_intake_takes_declared_firmware_and_allowlisted_firmware(
    host: Layout, signed: dict[str, Path], kernel: str, tmp_path: Path
) -> None:
    """``ms_firmware`` declares ``modstage/test.bin``: its drop is taken in; ``ms_exporter``
    with the same file (the bundle's next generation) is refused, then taken in once
    ``[bundles.demo] firmware`` names it."""
    fw = _tree(tmp_path / "fw", "modstage/test.bin")
    _stage(host, kernel, signed["ms_firmware"], fw)
    [outcome] = make_intake(host).run()
    assert outcome.accepted, outcome.reasons
    _stage(host, kernel, signed["ms_exporter"], fw)
    [outcome] = make_intake(host).run()
    assert not outcome.accepted
    _stage(host, kernel, signed["ms_exporter"], fw)
    allow = Config.from_dict({"bundles": {"demo": {"firmware": ["modstage/*"]}}})
    [outcome] = make_intake(host, allow).run()
    assert outcome.accepted, outcome.reasons


def test_declarations_of_a_module_that_fails_verification_do_not_count(
    host: Layout, modules: dict[str, Path], kernel: str, tmp_path: Path
) -> None:
    """An unsigned ``ms_firmware`` is refused, and its ``MODULE_FIRMWARE`` vouches for
    nothing: its firmware is refused too."""
    _stage(host, kernel, modules["ms_firmware"], _tree(tmp_path / "fw", "modstage/test.bin"))
    [outcome] = make_intake(host).run()
    assert not outcome.accepted
    assert any(r.startswith("firmware/modstage/test.bin: not declared") for r in outcome.reasons)


@pytest.mark.parametrize(
    "where", ["lib/firmware", "lib/firmware/updates", "lib/firmware/{release}"]
)
def test_intake_refuses_a_name_the_hosts_firmware_provides_unless_overridden(
    host: Layout, signed: dict[str, Path], kernel: str, tmp_path: Path, where: str
) -> None:
    """The host's ``/lib/firmware[/updates][/<release>]/modstage/test.bin`` makes the
    declared file a shadow: refused naming the host's file, taken in once
    ``[bundles.demo] firmware_override`` names it."""
    at = host.root / where.format(release=kernel) / "modstage/test.bin"
    at.parent.mkdir(parents=True)
    at.write_bytes(b"the host's")
    fw = _tree(tmp_path / "fw", "modstage/test.bin")
    _stage(host, kernel, signed["ms_firmware"], fw)
    [outcome] = make_intake(host).run()
    shown = "/" + where.format(release=kernel) + "/modstage/test.bin"
    assert outcome.reasons == (
        f"firmware/modstage/test.bin: the host provides {shown}; "
        "[bundles.demo] firmware_override does not name it",
    )
    _stage(host, kernel, signed["ms_firmware"], fw)
    allow = Config.from_dict({"bundles": {"demo": {"firmware_override": ["modstage/test.bin"]}}})
    [outcome] = make_intake(host, allow).run()
    assert outcome.accepted, outcome.reasons

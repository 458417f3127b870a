"""Bundle-wide rules at intake: load order against depends=, members by their ELF name."""

from __future__ import annotations

import shutil
from pathlib import Path

from service.layout import Layout
from service.verify.bundle import order_problems
from service.verify.verdict import Verdict
from stager.drop import ModuleSpec, stage
from tests.kmod import SigningKey, sign
from tests.service.fakes import make_intake


def v(file: str, name: str, *depends: str) -> Verdict:
    return Verdict(file, True, name=name, depends=depends)


def test_dependency_on_a_later_member_is_refused() -> None:
    """finit_module does not load dependencies: a later provider means ENOENT at boot."""
    problems = order_problems([v("a.ko", "consumer", "exporter"), v("b.ko", "exporter")])
    assert problems == [
        "a.ko: ENOENT: depends on exporter (b.ko), which the bundle loads later; "
        "modules load in manifest order, put it first"
    ]
    assert order_problems([v("b.ko", "exporter"), v("a.ko", "consumer", "exporter")]) == []


def test_members_are_matched_by_elf_name_not_file_name() -> None:
    """nvidia-580.ko is module nvidia; '-' and '_' are the same to the kernel."""
    verdicts = [v("nvidia-modeset.ko", "nvidia_modeset", "nvidia"), v("nvidia-580.ko", "nvidia")]
    assert "depends on nvidia (nvidia-580.ko)" in order_problems(verdicts)[0]
    assert order_problems([v("x.ko", "nvidia-uvm"), v("y.ko", "nvidia_uvm")])[0].startswith(
        "y.ko: EEXIST: module nvidia_uvm is also x.ko"
    )


def take(host: Layout, kernel: str, files: list[Path]) -> tuple[bool, tuple[str, ...]]:
    stage(
        host.incoming,
        bundle="b",
        version="1",
        kernel=kernel,
        modules=[ModuleSpec(f, "") for f in files],
    )
    intake = make_intake(host)
    [outcome] = intake.run()
    return outcome.accepted, outcome.reasons


def test_intake_refuses_consumer_before_its_exporter_even_renamed(
    host: Layout, modules: dict[str, Path], rsa_key: SigningKey, kernel: str, tmp_path: Path
) -> None:
    """The exporter under another file name is still recognised as the dependency."""
    consumer = sign(modules["ms_consumer"], rsa_key, tmp_path / "ms_consumer.ko")
    exporter = tmp_path / "renamed"
    exporter.mkdir()
    shutil.copy(
        sign(modules["ms_exporter"], rsa_key, tmp_path / "e.ko"), exporter / "exporter-2.ko"
    )
    accepted, reasons = take(host, kernel, [consumer, exporter / "exporter-2.ko"])
    assert not accepted
    assert any("depends on ms_exporter" in r and "exporter-2.ko" in r for r in reasons), reasons
    accepted, reasons = take(host, kernel, [exporter / "exporter-2.ko", consumer])
    assert accepted, reasons


def test_parameter_with_byte_a0_outside_quotes_is_refused() -> None:
    """lib/ctype.c counts 0xA0 as a space: U+00A0 (UTF-8 C2 A0) would split the value."""
    from service.verify.modfile.param_check import param_problems

    assert param_problems("label=a\u00a0b")[0].startswith("EINVAL (policy): byte 0xA0 at offset 8")
    assert param_problems('label="a\u00a0b" count=1') == []
    assert param_problems("label=caf\u00e9 count=2") == []  # é is C3 A9: no 0xA0

"""``load_rules`` on plain values: which target release a rule starts at."""

from __future__ import annotations

from pathlib import Path

import pytest

from service.errors import ModuleRejected
from service.verify.loadrules import load_rules
from service.verify.modfile.modinfo import ModInfo
from service.verify.target.kernel import Target


def _outcome(ko: bytes, release: str) -> str | None:
    """The reason ``load_rules`` refuses ``ko`` on a ``release`` target, or None."""
    try:
        load_rules(ModInfo.from_bytes(ko), Target.from_spec(release))
    except ModuleRejected as exc:
        return f"{exc.refusal.errno}: {exc.reason}"
    return None


def _unnamed_unallocated(ko: bytes) -> bytes:
    """``ko`` with its (unallocated) ``.comment`` named past the end of the name table."""
    from tests.oracle import elf

    headers = elf.sections(ko)
    table = headers[elf.index_of(ko, ".shstrtab")]
    assert not int(headers[elf.index_of(ko, ".comment")]["flags"]) & 0x2  # not SHF_ALLOC
    return elf.set_section(ko, ".comment", name=int(table["size"]) + 8)


@pytest.mark.parametrize(("release", "checked"), [("6.11.11", False), ("6.12.0", True)])
def test_names_of_unallocated_sections_are_checked_from_6_12(
    modules: dict[str, Path], release: str, checked: bool
) -> None:
    """An unallocated section whose name lies outside the name table: 6.13's
    ``elf_validity_cache_secstrings`` (torvalds/linux 3c5700aeabd8, "module: Factor out
    elf_validity_cache_secstrings", merged for 6.13-rc1), which Debian's 6.12 carries,
    refuses it (ENOEXEC); before, only allocated sections' names were checked, so on a
    6.11 target the edit changes nothing: the verdict is the unedited module's."""
    ko = modules["ms_params"].read_bytes()
    edited = _unnamed_unallocated(ko)
    assert ModInfo.from_bytes(edited).elf_strict is not None
    said = _outcome(edited, release)
    if checked:
        assert said is not None and said.startswith("ENOEXEC: "), said
        assert "6.12's ELF validation" in said and "name outside the name table" in said
    else:
        assert said == _outcome(ko, release)


def _second_modinfo(ko: bytes, section_type: int | None = None) -> bytes:
    """``ko`` with its (unallocated) ``.comment`` named ``.modinfo`` (and of ``section_type``)."""
    from tests.oracle import elf

    name = int(elf.sections(ko)[elf.index_of(ko, ".modinfo")]["name"])
    comment = elf.index_of(ko, ".comment")
    edited = elf.set_section(ko, comment, name=name)
    return edited if section_type is None else elf.set_section(edited, comment, type=section_type)


@pytest.mark.parametrize(
    ("release", "rule"),
    [("6.3.13", None), ("6.4.0", "6.4's"), ("6.11.11", "6.4's"), ("6.12.0", "6.12's")],
)
def test_a_second_modinfo_is_refused_from_6_4(
    modules: dict[str, Path], release: str, rule: str | None
) -> None:
    """A second ``.modinfo``, allocated or not: since Linux 6.4 (torvalds/linux "module: move
    more elf validity checks to elf_validity_check()", Luis Chamberlain, merged for
    6.4-rc1 with "module: add sanity check for ELF module section") ``elf_validity_check``
    counts the sections of that name and refuses more than one (ENOEXEC), so a 6.6 target
    (Talos 1.7 and 1.8) refuses it as 6.12 does; before 6.4 the kernel finds the allocated
    one and the edit changes nothing."""
    ko = modules["ms_params"].read_bytes()
    said = _outcome(_second_modinfo(ko), release)
    if rule is None:
        assert said == _outcome(ko, release)
    else:
        assert said is not None and "more than one .modinfo" in said, said
        assert f"({rule} ELF validation)" in said


@pytest.mark.parametrize(("release", "refused"), [("6.11.11", False), ("6.12.0", True)])
def test_a_second_modinfo_without_contents_is_counted_from_6_12(
    modules: dict[str, Path], release: str, refused: bool
) -> None:
    """6.4's loop skips SHT_NOBITS sections before it compares names, so a second
    ``.modinfo`` of that type is not counted on a 6.4-6.11 target; 6.13's
    ``find_any_unique_sec`` (``elf_validity_cache_index_info``, in Debian's 6.12) counts
    every section of the name and refuses it."""
    ko = modules["ms_params"].read_bytes()
    edited = _second_modinfo(ko, section_type=8)  # SHT_NOBITS
    assert ModInfo.from_bytes(edited).elf_6_4 is None
    said = _outcome(edited, release)
    if refused:
        assert said is not None and "more than one .modinfo" in said, said
    else:
        assert said == _outcome(ko, release)


def test_two_symbol_tables_are_6_4s_refusal(modules: dict[str, Path]) -> None:
    """6.1 takes the first SHT_SYMTAB; 6.4's ``elf_validity_check`` counts them and refuses
    any number but one ("module has no symbols (stripped?)", ENOEXEC)."""
    from tests.oracle import elf

    ko = modules["ms_params"].read_bytes()
    symtab = elf.sections(ko)[elf.index_of(ko, ".symtab")]
    edited = elf.set_section(ko, ".comment", type=2, link=int(symtab["link"]))
    info = ModInfo.from_bytes(edited)
    assert info.elf_6_4 == "2 symbol tables, not exactly one"
    assert info.elf_strict == "2 symbol tables, not exactly one"
    said = _outcome(edited, "6.6.0")
    assert said is not None
    assert said.endswith("2 symbol tables, not exactly one (6.4's ELF validation)"), said


@pytest.mark.parametrize(("release", "kernel"), [("6.3.13", False), ("6.4.0", True)])
def test_this_modules_size_is_the_kernels_check_from_6_4(
    modules: dict[str, Path], release: str, kernel: bool
) -> None:
    """6.4's "module: add sanity check for ELF module section" compares the size of
    ``.gnu.linkonce.this_module`` with ``sizeof(struct module)``: from 6.4 a wrong size is
    the kernel's ENOEXEC, before it modstage's safety policy (the kernel does not check and
    a short one oopses)."""
    from dataclasses import replace

    info = ModInfo.from_bytes(modules["ms_params"].read_bytes())
    assert info.this_module_size is not None
    target = replace(Target.from_spec(release), struct_module=info.this_module_size + 8)
    with pytest.raises(ModuleRejected) as refused:
        load_rules(info, target)
    refusal = refused.value.refusal
    assert (refusal.errno, refusal.policy) == ("ENOEXEC", not kernel)
    assert ".gnu.linkonce.this_module is" in refusal.message

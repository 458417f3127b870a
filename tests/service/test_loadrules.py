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


@pytest.mark.xfail(
    strict=True,
    reason="defect: the checks Linux 6.4 added are gated at 6.12 (loadrules.load_rules)",
)
def test_a_second_modinfo_is_refused_from_6_4(modules: dict[str, Path]) -> None:
    """A second ``.modinfo``, allocated or not: since Linux 6.4 (torvalds/linux "module: move
    more elf validity checks to elf_validity_check()", Luis Chamberlain, merged for
    6.4-rc1 with "module: add sanity check for ELF module section") ``elf_validity_check``
    counts the sections of that name and refuses more than one (ENOEXEC), so a 6.6 target
    (Talos 1.7 and 1.8) refuses it as 6.12 does."""
    from tests.oracle import elf

    ko = modules["ms_params"].read_bytes()
    name = int(elf.sections(ko)[elf.index_of(ko, ".modinfo")]["name"])
    said = _outcome(elf.set_section(ko, ".comment", name=name), "6.6.0")
    assert said is not None and said.startswith("ENOEXEC: ") and "ELF validation" in said, said

"""``load_rules`` and ``finish`` on plain values: which target release a rule starts at, and
how the refusals symbol resolution leaves for the bundle are judged."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

import pytest

from service.errors import ModuleRejected
from service.verify.loadrules import finish, load_rules
from service.verify.modfile.modinfo import ModInfo
from service.verify.modfile.symtab import Export
from service.verify.targetkernel.kernel import Target


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


def _with_symbols(ko: Path) -> ModInfo:
    return _with_symbols_of(ko.read_bytes())


def _with_symbols_of(data: bytes) -> ModInfo:
    return ModInfo.from_elf(lambda at, n: data[at : at + n], len(data), symbols=True)


def _vm_target(info: ModInfo, exports: Mapping[str, Export] | None = None) -> Target:
    """Debian 12's 6.1 as the rules need it, built for ``info``'s vermagic; ``exports`` the
    whole table of its exports (None: only what a probe knows, nothing)."""
    from service.verify.targetkernel.exports import KernelExports
    from service.verify.targetkernel.kconfig import KernelConfig

    config = KernelConfig.parse("CONFIG_MODVERSIONS=y\n", "test")
    known = KernelExports(None, {}) if exports is None else KernelExports.known(exports, "test")
    return Target("6.1.0-57-amd64", info.vermagic, "test", config, exports=known,
                  struct_module=info.this_module_size)  # fmt: skip


def test_imports_nothing_known_exports_are_one_policy_refusal(modules: dict[str, Path]) -> None:
    """When the target's exports are not all known and CRCs are required, the imports that
    neither the target nor the bundle's earlier modules export are one policy refusal
    (EINVAL) counting them and naming the first in symbol-table order; an import the
    bundle exports is not among them, and once every import is found nothing is refused."""
    info = _with_symbols(modules["ms_consumer"])
    assert info.symbols is not None
    names = [imp.name for imp in info.symbols.imports]
    provider = _with_symbols(modules["ms_exporter"])
    assert provider.symbols is not None
    bundle = {e: Export(None, False, "", "ms_exporter") for e in provider.symbols.exports}
    from_bundle = [n for n in names if n in bundle]
    assert from_bundle and len(from_bundle) < len(names)
    target = _vm_target(info)
    linkage = load_rules(info, target)
    assert linkage is not None and [i.name for i in linkage.unresolved] == names
    with pytest.raises(ModuleRejected) as refused:
        finish(linkage, target, bundle)
    rest = [n for n in names if n not in bundle]
    assert str(refused.value.refusal).startswith(
        f"EINVAL (policy): {len(rest)} imported symbols are not among the target's known "
        f"exports (e.g. {rest[0]}; "
    )
    everything = {**bundle, **{n: Export(None, False, "", "vmlinux") for n in rest}}
    finish(linkage, target, everything)  # nothing left: nothing refused
    one = {**everything}
    del one[rest[-1]]
    with pytest.raises(
        ModuleRejected, match=rf"\(policy\): 1 imported symbols .*\(e.g. {rest[-1]};"
    ):
        finish(linkage, target, one)


def test_an_import_the_targets_files_disagree_about_is_a_policy_refusal(
    modules: dict[str, Path],
) -> None:
    """An export whose CRC the image and ``Module.symvers`` give differently is not known:
    a module importing it is refused as modstage's policy (EINVAL, the kernel's CRC is not
    known), naming the symbol and both files, even though the table has the symbol."""
    info = _with_symbols(modules["ms_params"])
    assert info.symbols is not None
    exports = {i.name: Export(None, False, "", "vmlinux") for i in info.symbols.imports}
    target = _vm_target(info, exports)
    name = info.symbols.imports[0].name
    table = target.exports.table
    disagree = {name: "vmlinuz gives CRC 0x1, Module.symvers gives 0x2"}
    target.exports._table = table._replace(disagree=disagree)
    linkage = load_rules(info, target)
    assert linkage is not None
    with pytest.raises(ModuleRejected) as refused:
        finish(linkage, target, {})
    assert str(refused.value.refusal) == (
        f"EINVAL (policy): the target's files disagree about the CRC of {name}: "
        "vmlinuz gives CRC 0x1, Module.symvers gives 0x2"
    )
    target.exports._table = table
    finish(load_rules(info, target) or pytest.fail("no linkage"), target, {})


def test_of_several_policy_failures_the_last_symbols_is_reported(
    modules: dict[str, Path],
) -> None:
    """``simplify_symbols`` returns its last failing symbol's error: among policy failures
    too, the one at the latest symbol is reported, and the unknown imports stand at the
    last of them, so a disagreement about an earlier symbol is not what is reported."""
    info = _with_symbols(modules["ms_consumer"])
    assert info.symbols is not None and len(info.symbols.imports) >= 3
    target = _vm_target(info)
    middle = info.symbols.imports[1].name
    table = target.exports.table
    target.exports._table = table._replace(disagree={middle: "two files"})
    linkage = load_rules(info, target)
    assert linkage is not None
    with pytest.raises(ModuleRejected, match=r"imported symbols are not among"):
        finish(linkage, target, {})


def test_a_common_symbol_is_the_kernels_enoexec_naming_it(modules: dict[str, Path]) -> None:
    """``simplify_symbols`` refuses a SHN_COMMON symbol that is not LTO's ("please compile
    with -fno-common", ENOEXEC; read in kernel/module/main.c, no VM case loads one); with every import known, that is the refusal, naming the
    symbol; with an import unknown too (ENOENT), the kernel returns the error of the later
    of the two in the symbol table."""
    from tests.oracle import elf

    ko = modules["ms_params"].read_bytes()
    offset, size = elf.section_data(ko, ".symtab")
    for at in range(offset + elf.SYM.size, offset + size, elf.SYM.size):
        name_at, info, other, shndx, value, length = elf.SYM.unpack_from(ko, at)
        if name_at and 0 < shndx < 0xFF00 and info & 0xF in (1, 2):  # a named object or function
            break
    else:
        pytest.fail("no defined symbol")
    edited = bytearray(ko)
    elf.SYM.pack_into(edited, at, name_at, info, other, 0xFFF2, value, length)  # SHN_COMMON
    info_ = _with_symbols_of(bytes(edited))
    assert info_.symbols is not None and info_.symbols.problem is not None
    index, said = info_.symbols.problem
    assert index == (at - offset) // elf.SYM.size and said.startswith("common symbol ")
    exports = {i.name: Export(None, False, "", "vmlinux") for i in info_.symbols.imports}
    target = _vm_target(info_, exports)
    linkage = load_rules(info_, target)
    assert linkage is not None
    with pytest.raises(ModuleRejected) as refused:
        finish(linkage, target, {})
    assert str(refused.value.refusal) == f"ENOEXEC: {said}"
    missing = info_.symbols.imports[0]  # not exported: ENOENT at its own index
    del exports[missing.name]
    target = _vm_target(info_, exports)
    linkage = load_rules(info_, target)
    assert linkage is not None
    with pytest.raises(ModuleRejected) as both:
        finish(linkage, target, {})
    later = "ENOENT" if missing.at > index else "ENOEXEC"
    assert both.value.refusal.errno == later, (missing.at, index)


@pytest.mark.parametrize("loader_knows", [True, False])
def test_a_module_namespace_naming_the_module_is_judged_where_the_image_says_so(
    modules: dict[str, Path], tmp_path: Path, loader_knows: bool
) -> None:
    """An export in a ``module:`` namespace that names the importing module needs no
    ``MODULE_IMPORT_NS`` where the target's image says its loader knows such namespaces
    (7.2's ``verify_module_namespace``); where the image was read and says it does not, the
    import is refused as the kernel refuses any namespace not imported (EINVAL)."""
    from dataclasses import replace

    from service.verify.targetkernel.exports import KernelExports, Sources

    info = _with_symbols(modules["ms_params"])
    assert info.symbols is not None
    imports = info.symbols.imports
    exports = {i.name: Export(None, False, "", "vmlinux") for i in imports}
    name = imports[0].name
    exports[name] = Export(None, False, "module:ms_params", "vmlinux")
    target = _vm_target(info)
    read = KernelExports(Sources(tmp_path / "vmlinuz", tmp_path / "modules", None), {})
    table = KernelExports.known(exports, "test").table
    read._table = table._replace(module_namespaces=loader_knows, kflagstab=False)
    target = replace(target, exports=read)
    linkage = load_rules(info, target)
    assert linkage is not None
    if loader_knows:
        finish(linkage, target, {})
    else:
        with pytest.raises(ModuleRejected, match=rf"EINVAL: module uses symbol {name} from"):
            finish(linkage, target, {})


@pytest.mark.parametrize(
    ("running", "refused"),
    [(None, "policy"), (frozenset(), None), (frozenset({"ms_params"}), "kernel")],
)
def test_a_builtin_name_is_judged_by_where_sysfs_names_were_read(
    modules: dict[str, Path],
    tmp_path: Path,
    running: frozenset[str] | None,
    refused: str | None,
) -> None:
    """A module named in ``modules.builtin``: the running kernel's /sys/module is the whole
    answer (an entry there is the kernel's EINVAL, none is no refusal); read from the image
    only, a name the image does not list may still get its entry when its built-in driver
    registers, so it is refused as policy (EINVAL)."""
    from dataclasses import replace

    from service.verify.targetkernel.exports import KernelExports, Sources

    info = _with_symbols(modules["ms_params"])
    assert info.symbols is not None
    exports = {i.name: Export(None, False, "", "vmlinux") for i in info.symbols.imports}
    read = KernelExports(Sources(tmp_path / "vmlinuz", tmp_path / "modules", None), {})
    read._table = KernelExports.known(exports, "test").table._replace(
        builtin_sysfs=frozenset({"other"}), kflagstab=False, module_namespaces=False
    )
    target = replace(
        _vm_target(info), exports=read, builtin=frozenset({"ms_params"}), builtin_sysfs=running
    )
    linkage = load_rules(info, target)
    assert linkage is not None
    if refused is None:
        finish(linkage, target, {})
        return
    with pytest.raises(ModuleRejected) as caught:
        finish(linkage, target, {})
    assert caught.value.refusal.errno == "EINVAL"
    assert caught.value.refusal.policy == (refused == "policy")
    if refused == "policy":
        assert "which a built-in driver adds when it registers" in caught.value.reason


def test_a_modules_ksymtab_gpl_exports_nothing_from_7_1_on(modules: dict[str, Path]) -> None:
    """An export a module lists in ``__ksymtab_gpl`` resolves a later GPL module's import on
    6.1; from 7.1 on the loader ignores that section (``find_module_sections``), so the same
    import is an unknown symbol (ENOENT), while one from its ``__ksymtab`` still resolves."""
    from dataclasses import replace

    from tests.oracle.elf import rename_section

    data = modules["ms_exporter"].read_bytes()
    gpl_only = rename_section(rename_section(data, "__ksymtab", "__ksymtab_gpl"),
                              "__kcrctab", "__kcrctab_gpl")  # fmt: skip
    consumer = _with_symbols(modules["ms_consumer"])
    assert consumer.symbols is not None
    for exporter, stays in ((data, True), (gpl_only, False)):
        provider = _with_symbols_of(exporter)
        assert provider.symbols is not None and provider.symbols.exports
        bundle = {n: e._replace(owner="ms_exporter") for n, e in provider.symbols.exports.items()}
        rest = {i.name: Export(None, False, "", "vmlinux") for i in consumer.symbols.imports}
        for name in bundle:
            del rest[name]
        old = _vm_target(consumer, rest)
        finish(load_rules(consumer, old), old, bundle)  # type: ignore[arg-type]
        new = replace(old, release="7.2.13+deb14-amd64")
        linkage = load_rules(consumer, new)
        assert linkage is not None
        if stays:
            finish(linkage, new, bundle)
            continue
        with pytest.raises(ModuleRejected, match=r"ENOENT: .*ms_exporter_value"):
            finish(linkage, new, bundle)

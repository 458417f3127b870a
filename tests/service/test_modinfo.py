"""The hand-written .modinfo reader and the kernel's vermagic rule."""

from __future__ import annotations

import contextlib
import struct
import subprocess
from dataclasses import replace
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from service.errors import ModuleRejected
from service.verify.loadrules import check_vermagic, load_rules
from service.verify.modfile.modinfo import ModInfo, same_magic
from service.verify.modfile.symtab import Export
from service.verify.targetkernel.exports import KernelExports
from service.verify.targetkernel.kconfig import KernelConfig
from service.verify.targetkernel.kernel import Target
from tests.service.strategies_verify import mutated

DEBIAN = ["net/key/af_key.ko", "fs/fat/vfat.ko", "drivers/net/dummy.ko", "fs/ext4/ext4.ko"]


def rejected(data: bytes) -> str:
    with pytest.raises(ModuleRejected) as exc:
        ModInfo.from_bytes(data)
    return exc.value.reason


def test_test_module_fields(modules: dict[str, Path], kernel: str) -> None:
    """ms_params: name, vermagic, srcversion (MODULE_VERSION), parameters, license, CRCs."""
    info = ModInfo.from_bytes(modules["ms_params"].read_bytes())
    assert info.name == "ms_params"
    assert info.vermagic is not None and info.vermagic.startswith(kernel + " ")
    assert info.srcversion and len(info.srcversion) == 23
    assert sorted(p.split(":")[0] for p in info.parm) == ["count", "label"]
    assert (info.license, info.depends, info.has_versions, info.machine) == ("GPL", (), True, 62)


def test_depends_and_firmware(modules: dict[str, Path]) -> None:
    """depends= is split on commas; MODULE_FIRMWARE entries are collected."""
    assert ModInfo.from_bytes(modules["ms_consumer"].read_bytes()).depends == ("ms_exporter",)
    fw = ModInfo.from_bytes(modules["ms_firmware"].read_bytes())
    assert fw.firmware == ("modstage/test.bin",) and fw.srcversion is None


def kmod_field(path: Path, field: str) -> str:
    out = subprocess.run(["modinfo", "-F", field, str(path)], capture_output=True, text=True)
    return out.stdout.rstrip("\n")


@pytest.mark.parametrize("relative", DEBIAN)
def test_agrees_with_kmod_modinfo_on_debian_modules(kernel: str, relative: str) -> None:
    """name, vermagic, depends and srcversion equal what kmod's modinfo prints."""
    path = Path(f"/lib/modules/{kernel}/kernel") / relative
    info = ModInfo.from_bytes(path.read_bytes())
    assert info.name == kmod_field(path, "name")
    assert info.vermagic == kmod_field(path, "vermagic")
    assert ",".join(info.depends) == kmod_field(path, "depends")
    assert (info.srcversion or "") == kmod_field(path, "srcversion")


def rename_section(data: bytes, name: bytes) -> bytes:
    needle = name + b"\0"
    assert data.count(needle) == 1
    return data.replace(needle, name[:-1] + b"X\0")


def test_missing_modinfo_parses_without_vermagic(modules: dict[str, Path]) -> None:
    """An ELF without .modinfo loads in the kernel's ELF checks; it just has no vermagic."""
    data = rename_section(modules["ms_params"].read_bytes(), b".modinfo")
    info = ModInfo.from_bytes(data)
    assert (info.vermagic, info.name, info.module_name) == (None, None, "ms_params")


def test_missing_this_module_is_enoexec(modules: dict[str, Path]) -> None:
    """Without .gnu.linkonce.this_module the kernel finds no module in the object."""
    data = rename_section(modules["ms_params"].read_bytes(), b".gnu.linkonce.this_module")
    assert rejected(data).startswith("ENOEXEC: no module found")


def patch(data: bytes, offset: int, fmt: str, value: int) -> bytes:
    out = bytearray(data)
    struct.pack_into(fmt, out, offset, value)
    return bytes(out)


@pytest.mark.parametrize(
    ("edit", "expected"),
    [
        (lambda d: b"\x7fELG" + d[4:], "not an ELF file"),
        (lambda d: patch(d, 16, "<H", 2), "ELF type 2 is not a relocatable object"),
        (lambda d: patch(d, 40, "<Q", len(d) - 10), "section header table outside"),
        (lambda d: patch(d, 58, "<H", 40), "section header size 40 is not 64"),
        (lambda d: patch(d, 62, "<H", 0), "bad section name table index"),
        (lambda d: d[:63], "too short for an ELF header"),
        (lambda d: d[: len(d) // 2], "section header table outside"),
    ],
)
def test_malformed_elf_is_enoexec(modules: dict[str, Path], edit: object, expected: str) -> None:
    """Each header defect is caught before any offset is followed."""
    data = edit(modules["ms_params"].read_bytes())  # type: ignore[operator]
    assert expected in rejected(data)


def test_section_beyond_the_file_is_enoexec(modules: dict[str, Path]) -> None:
    """A section whose bytes lie past the (signed) length is refused."""
    data = modules["ms_params"].read_bytes()
    shoff = struct.unpack_from("<Q", data, 40)[0]
    bad = patch(data, shoff + 64 * 1 + 24, "<Q", len(data))  # section 1's sh_offset
    assert rejected(bad) == "ENOEXEC: section 1 lies outside the module"


@pytest.mark.parametrize(
    ("a", "b", "crcs", "same"),
    [
        ("6.1.0-57-amd64 SMP mod_unload ", "6.1.0-57-amd64 SMP mod_unload ", False, True),
        ("6.1.0-56-amd64 SMP mod_unload ", "6.1.0-57-amd64 SMP mod_unload ", False, False),
        ("6.1.0-56-amd64 SMP mod_unload ", "6.1.0-57-amd64 SMP mod_unload ", True, True),
        ("6.1.0-57-amd64 SMP preempt ", "6.1.0-57-amd64 SMP mod_unload ", True, False),
        ("6.1.0-57-amd64", "6.1.0-57-amd64 SMP", True, False),
    ],
)
def test_same_magic_is_the_kernels(a: str, b: str, crcs: bool, same: bool) -> None:
    """With CRCs only the part after the release word counts; without, the whole string."""
    assert same_magic(a, b, crcs) is same


def info_with(vermagic: str | None, has_versions: bool = True) -> ModInfo:
    fields = [("vermagic", vermagic)] if vermagic is not None else []
    return ModInfo.from_fields(fields, 62, has_versions)


VM = "6.1.0-57-amd64 SMP preempt mod_unload modversions "


def target_with(vermagic: str | None, force_load: bool = False, modversions: bool = True) -> Target:
    """Debian 12's 6.1 as far as the rules need it (CONFIG_MODVERSIONS=y unless told)."""
    text = "CONFIG_MODULE_FORCE_LOAD=y\n" if force_load else ""
    text += "CONFIG_MODVERSIONS=y\n" if modversions else "# CONFIG_MODVERSIONS is not set\n"
    return Target("6.1.0-57-amd64", vermagic, "test", KernelConfig.parse(text, "test"))


def test_check_vermagic_applies_same_magic_to_the_targets_full_vermagic() -> None:
    """same_magic decides; flags differing after the release word are ENOEXEC (the kernel's)."""
    check_vermagic(info_with(VM), target_with(VM))
    with pytest.raises(ModuleRejected, match=r"^ENOEXEC: vermagic .* does not match"):
        check_vermagic(info_with(VM), target_with("6.1.0-57-amd64 SMP mod_unload modversions "))
    with pytest.raises(ModuleRejected, match=r"^ENOEXEC: vermagic .* does not match"):
        check_vermagic(info_with(VM.replace("-57-", "-56-"), False), target_with(VM))


def test_check_vermagic_policies_name_themselves() -> None:
    """Another release with modversions, no target vermagic, or force-loadable: "(policy)"."""
    with pytest.raises(ModuleRejected, match=r"^ENOEXEC \(policy\): vermagic is for kernel"):
        check_vermagic(info_with(VM.replace("-57-", "-56-")), target_with(VM))
    with pytest.raises(ModuleRejected, match=r"^ENOEXEC \(policy\): cannot apply same_magic"):
        check_vermagic(info_with(VM), target_with(None))
    with pytest.raises(ModuleRejected, match=r"^ENOEXEC \(policy\): no vermagic"):
        check_vermagic(info_with(None), target_with(VM, force_load=True))
    with pytest.raises(ModuleRejected, match=r"^ENOEXEC: no vermagic in .modinfo and no MODULE"):
        check_vermagic(info_with(None), target_with(VM))


def test_another_release_without_crcs_is_the_kernels_refusal_even_unread() -> None:
    """A module without ``__versions`` built for another release: ``same_magic`` compares
    the whole vermagic, release included, so the kernel refuses it (ENOEXEC, not a policy)
    even where the target's own vermagic could not be read."""
    other = info_with(VM.replace("-57-", "-56-"), has_versions=False)
    with pytest.raises(ModuleRejected) as refused:
        check_vermagic(other, target_with(None))
    assert str(refused.value.refusal) == (
        "ENOEXEC: vermagic is for kernel 6.1.0-56-amd64, not 6.1.0-57-amd64"
    )


def test_boot_judges_the_known_crcs_and_built_in_modules(modules: dict[str, Path]) -> None:
    """At boot (no symbol table read) a CRC the target is known to export and the module
    disagrees with is EINVAL naming the symbol, and a module built into the target is EINVAL:
    the kernel's own refusal with a /sys/module entry, a named policy without; the same
    module against the same target with neither is accepted."""
    info = ModInfo.from_bytes(modules["ms_params"].read_bytes())
    assert info.symbols is None and info.module_name == "ms_params"
    name, crc = next((n, c) for n, c in info.versions if n == "_printk")
    good = replace(target_with(VM), struct_module=info.this_module_size)
    assert load_rules(info, good) is None
    other = Export(crc ^ 1, False, "", "vmlinux")
    with pytest.raises(ModuleRejected) as crcs:
        load_rules(info, replace(good, exports=KernelExports.known({name: other}, "test")))
    assert str(crcs.value.refusal) == (
        f"EINVAL: disagrees about version of symbol {name} (module {crc:#x}, target {crc ^ 1:#x})"
    )
    with pytest.raises(ModuleRejected) as sysfs:
        load_rules(info, replace(good, builtin_sysfs=frozenset({"ms_params"})))
    assert (sysfs.value.refusal.errno, sysfs.value.refusal.policy) == ("EINVAL", False)
    assert "has a /sys/module entry made by built-in code" in sysfs.value.reason
    with pytest.raises(ModuleRejected) as builtin:
        load_rules(info, replace(good, builtin=frozenset({"ms_params"})))
    assert (builtin.value.refusal.errno, builtin.value.refusal.policy) == ("EINVAL", True)
    assert "built into the target kernel (modules.builtin)" in builtin.value.reason


def test_without_modversions_no_crc_is_compared_and_vermagic_is_compared_whole(
    modules: dict[str, Path],
) -> None:
    """A kernel built without CONFIG_MODVERSIONS (Debian's 7.2) never reads __versions: a CRC
    that disagrees with the target's, module_layout's or another's, is not refused (with
    modversions module_layout's is, ENOEXEC), and same_magic compares the whole
    vermagic, release word included, even for a module that has __versions; with
    modversions the release word is skipped. Without the target's config, another release
    is refused as policy (it is not known which of the two the kernel does)."""
    info = ModInfo.from_bytes(modules["ms_params"].read_bytes())
    name, crc = next((n, c) for n, c in info.versions if n == "_printk")
    layout = info.crc_of["module_layout"]  # check_modstruct_version's, refused first (ENOEXEC)
    other = KernelExports.known(
        {
            name: Export(crc ^ 1, False, "", "vmlinux"),
            "module_layout": Export(layout ^ 1, False, "", "vmlinux"),
        },
        "test",
    )
    plain = replace(target_with(VM, modversions=False), struct_module=info.this_module_size)
    assert load_rules(info, replace(plain, exports=other)) is None
    with pytest.raises(ModuleRejected, match=r"^ENOEXEC: disagrees about version of symbol mod"):
        load_rules(info, replace(plain, config=target_with(VM).config, exports=other))
    moved = info_with(VM.replace("-57-", "-56-"))
    assert moved.has_versions
    with pytest.raises(ModuleRejected, match=r"^ENOEXEC: vermagic .* does not match"):
        check_vermagic(moved, replace(target_with(VM, modversions=False), exports=other))
    check_vermagic(moved, replace(target_with(VM), exports=KernelExports.known({}, "test")))
    unknown = Target("6.1.0-57-amd64", VM, "test", KernelConfig.missing("not read"))
    with pytest.raises(ModuleRejected, match=r"^ENOEXEC \(policy\): .*not known whether"):
        check_vermagic(moved, unknown)


@pytest.fixture(scope="module")
def small_module(modules: dict[str, Path]) -> bytes:
    return modules["ms_enodev"].read_bytes()


@settings(max_examples=300, deadline=None)
@given(data=st.data())
def test_fuzz_modinfo_only_domain_error(small_module: bytes, data: st.DataObject) -> None:
    """Mutations of a real module (biased to the ELF and section headers) raise only ModuleRejected."""
    shoff = struct.unpack_from("<Q", small_module, 40)[0]
    hot = data.draw(st.sampled_from([(0, 64), (shoff, len(small_module))]))
    with contextlib.suppress(ModuleRejected):
        ModInfo.from_bytes(data.draw(mutated(small_module, hot)))


@settings(max_examples=200)
@given(st.binary(max_size=512).map(lambda b: b"\x7fELF\x02\x01\x01" + b))
def test_fuzz_random_elf_headers_only_domain_error(data: bytes) -> None:
    """Random bytes behind an ELF64 magic raise only ModuleRejected."""
    with contextlib.suppress(ModuleRejected):
        ModInfo.from_bytes(data)


def section_index(data: bytes, name: bytes) -> int:
    """Index of the first section called ``name`` (test modules are well formed)."""
    shoff, shnum, shstrndx = (
        struct.unpack_from("<Q", data, 40)[0],
        *struct.unpack_from("<HH", data, 60),
    )
    str_off = struct.unpack_from("<Q", data, shoff + shstrndx * 64 + 24)[0]
    for i in range(shnum):
        sh_name = struct.unpack_from("<I", data, shoff + i * 64)[0]
        if data[str_off + sh_name : str_off + sh_name + len(name) + 1] == name + b"\0":
            return i
    raise KeyError(name)


def set_field(data: bytes, index: int, field: str, value: int) -> bytes:
    """``data`` with one field of section header ``index`` replaced."""
    offsets = {"name": (0, "<I"), "type": (4, "<I"), "flags": (8, "<Q"), "addr": (16, "<Q")}
    offsets |= {"offset": (24, "<Q"), "size": (32, "<Q"), "link": (40, "<I")}
    at, fmt = offsets[field]
    shoff = struct.unpack_from("<Q", data, 40)[0]
    return patch(data, shoff + index * 64 + at, fmt, value)


@pytest.mark.parametrize(
    ("edit", "expected"),
    [
        (lambda d: set_field(d, section_index(d, b".symtab"), "type", 1), "module has no symbols"),
        (lambda d: set_field(d, section_index(d, b".symtab"), "link", 0), "links to section 0"),
        (lambda d: set_field(d, 0, "addr", 0x1000), "section 0 is not an empty SHT_NULL"),
        (
            lambda d: set_field(d, section_index(d, b".gnu.linkonce.this_module"), "flags", 0x1),
            "no module found in object",
        ),
    ],
    ids=["no SHT_SYMTAB", "symtab sh_link 0", "section 0 address", "this_module not ALLOC"],
)
def test_elf_validity_and_setup_load_info_rules(
    modules: dict[str, Path], edit: object, expected: str
) -> None:
    """elf_validity_check / setup_load_info refusals are ENOEXEC, each naming its rule."""
    data = edit(modules["ms_params"].read_bytes())  # type: ignore[operator]
    reason = rejected(data)
    assert reason.startswith("ENOEXEC: ") and expected in reason, reason


def test_non_alloc_decoy_modinfo_before_the_real_one_is_ignored(modules: dict[str, Path]) -> None:
    """find_sec takes SHF_ALLOC sections only: a non-allocated ".modinfo" placed earlier is
    invisible to the kernel, and so to modstage."""
    data = modules["ms_params"].read_bytes()
    real = section_index(data, b".modinfo")
    decoy_index = section_index(data, b".rela.exit.text")
    assert decoy_index < real
    shoff = struct.unpack_from("<Q", data, 40)[0]
    name = struct.unpack_from("<I", data, shoff + real * 64)[0]
    decoy = b"vermagic=0.0.0-decoy SMP \0name=decoy\0"
    data += decoy
    for field, value in (
        ("name", name),
        ("type", 1),
        ("flags", 0),
        ("offset", len(data) - len(decoy)),
    ):
        data = set_field(data, decoy_index, field, value)
    data = set_field(data, decoy_index, "size", len(decoy))
    info = ModInfo.from_bytes(data)
    assert info.name == "ms_params" and info.vermagic is not None
    assert not info.vermagic.startswith("0.0.0-decoy")


def test_what_the_kernel_does_not_check_is_not_refused(modules: dict[str, Path]) -> None:
    """EI_CLASS/EI_DATA and the section name table's type are not examined by 6.1."""
    data = modules["ms_params"].read_bytes()
    assert ModInfo.from_bytes(data[:4] + b"\x01\x02" + data[6:]).name == "ms_params"
    shstrndx = struct.unpack_from("<H", data, 62)[0]
    assert ModInfo.from_bytes(set_field(data, shstrndx, "type", 1)).name == "ms_params"


def test_write_exec_section_is_reported(modules: dict[str, Path]) -> None:
    """module_enforce_rwx_sections looks at every section: a W+X one is named."""
    data = modules["ms_params"].read_bytes()
    assert ModInfo.from_bytes(data).write_exec is None
    wx = set_field(data, section_index(data, b".data"), "flags", 0x7)
    assert ModInfo.from_bytes(wx).write_exec == ".data"


def test_a_module_namespace_admits_the_modules_it_names_without_an_import() -> None:
    """`EXPORT_SYMBOL_FOR_MODULES` (7.2's kvm, cxl, btrfs exports) puts the symbol in a
    `module:<names>` namespace that admits, with no MODULE_IMPORT_NS, exactly the modules
    its comma-separated names match (`-` and `_` alike, a trailing `*` a prefix), as
    verify_module_namespace does; any other module is refused EINVAL like a missing import,
    and an ordinary namespace still needs its import. A loader without
    verify_module_namespace (Debian's 6.12) admits nobody implicitly."""
    from service.verify.linking import Rules, judge
    from service.verify.modfile.symtab import Import

    rules = Rules(False, False, modversions=False, module_namespaces=True)
    symbol = Import(1, "allow_smaller_maxphyaddr", False)
    shared = Export(None, True, "module:kvm-amd,kvm-intel", "kvm")
    globbed = Export(None, True, "module:dax_*", "cxl_core")

    def named(name: str) -> ModInfo:
        return replace(ModInfo.from_fields([("license", "GPL")], 62, False), module_name=name)

    assert judge(named("kvm_amd"), symbol, shared, rules) is None
    assert judge(named("kvm_intel"), symbol, shared, rules) is None
    assert judge(named("dax_hmem"), symbol, globbed, rules) is None
    refused = judge(named("kvm_amdx"), symbol, shared, rules)
    assert refused is not None and refused.errno == "EINVAL"
    ordinary = Export(None, True, "DMA_BUF", "vmlinux")
    assert judge(named("dma_buf"), symbol, ordinary, rules) is not None
    # Debian's 6.12 exports in module:kvm while its loader knows no such namespaces: kvm
    # must import it like any other
    older = Rules(False, False, modversions=True, module_namespaces=False)
    assert judge(named("kvm"), symbol, Export(None, True, "module:kvm", "vmlinux"), older)

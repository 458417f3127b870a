"""The target kernel's own files on Debian's three kernels (12's 6.1, 13's 6.12, sid's 7.2):
what modstage reads from them agrees with kmod and with the kernels.

The files are the test bed's (tests/vm/harness/kernel.py): 6.1 is this machine's package, 6.12
and 7.2 lie in their suites' roots (built by .ci/install). 7.2's packages put `vmlinuz`,
`config` and `System.map` in `/usr/lib/modules/<release>/` and nothing in `/boot`; the
targets below are laid out as each kernel's packages lay them out, so the 7.2 one is read
from the module tree alone.
"""

from __future__ import annotations

import io
from collections.abc import Mapping
from pathlib import Path

import pytest

from service.layout import Layout
from service.verify.modfile.symtab import Export
from service.verify.targetkernel.kernel import Target
from service.verify.targetkernel.kimage import builtin_sysfs, vmlinux
from stager.schema.paths import module_name, normalize_module_name
from tests.kmod.reference import disagreements, in_tree, kmod_field
from tests.vm.harness.builtin_key import find_builtin_cert
from tests.vm.harness.kernel import SERIES, Kernel

SAMPLE_EVERY = 100  # every 100th in-tree module (sorted): 41-43 per kernel; bench/modinfo: all


@pytest.fixture(scope="module", params=SERIES)
def kernel(request: pytest.FixtureRequest) -> Kernel:
    """Each Debian kernel of the test bed (its root is built on first use)."""
    return Kernel.named(request.param)


def _sample(kernel: Kernel) -> list[Path]:
    modules = in_tree(kernel.modules)
    assert len(modules) > 3000, f"{kernel.modules} holds only {len(modules)} modules"
    return modules[::SAMPLE_EVERY]


def _in_load_order(paths: list[Path]) -> list[Path]:
    """``paths`` with every module after those of them its ``depends=`` names (kmod's
    reading): verify judges files named together as one bundle loaded in that order."""
    by_name = {module_name(p.name): p for p in paths}
    out: list[Path] = []

    def visit(path: Path) -> None:
        if path in out:
            return
        for field in kmod_field(path, "depends"):
            for dep in filter(None, field.split(",")):
                if normalize_module_name(dep) in by_name:
                    visit(by_name[normalize_module_name(dep)])
        out.append(path)

    for path in paths:
        visit(path)
    return out


def test_modinfo_reads_as_kmod_does(kernel: Kernel) -> None:
    """Every `.modinfo` field of a fixed sample of the kernel's in-tree modules, the merged
    `parm` and the signature's signer, key serial and digest, read by modstage, equal what
    kmod's `modinfo -0 -F <field>` prints for the same file."""
    found = [line for path in _sample(kernel) for line in disagreements(path)]
    assert found == []


def _modinfo_prefixes(modules: Path) -> set[str]:
    """The names `modules.builtin.modinfo` gives built-in parameters (its `<name>.parm*=`)."""
    out = set()
    for entry in (modules / "modules.builtin.modinfo").read_bytes().split(b"\0"):
        name, dot, rest = entry.partition(b".")
        if dot and rest.startswith((b"parm=", b"parmtype=")):
            out.add(name.decode())
    return out


def test_builtin_sysfs_names_are_read_from_the_image(kernel: Kernel) -> None:
    """The /sys/module names read from the image (`__param` prefixes, `kernel` for
    core_param, `__modver`) hold the entries every Debian kernel has (module: sig_enforce;
    block; rcutree; printk; kernel) and, on 6.12 and 7.2, kfence, whose parameters
    modules.builtin.modinfo files under `core`, a name no /sys/module entry has."""
    names = builtin_sysfs(vmlinux(kernel.image.read_bytes()))
    assert {"module", "kernel", "block", "rcutree", "printk"} <= names
    if kernel.series != "6.1":
        assert "kfence" in names and "core" not in names
        assert "core" in _modinfo_prefixes(kernel.modules)


def _target_root(kernel: Kernel, directory: Path) -> Path:
    """A --root laid out as the kernel's packages lay it out: the image and config in /boot
    (6.1, 6.12) or in the module tree only (7.2), the module tree linked in."""
    if kernel.image.parent == kernel.modules:
        tree = directory / "usr/lib/modules" / kernel.release  # no lib/ link: the merged path
        tree.parent.mkdir(parents=True)
        tree.symlink_to(kernel.modules, target_is_directory=True)
        return directory
    tree = directory / "lib/modules" / kernel.release
    tree.parent.mkdir(parents=True)
    tree.symlink_to(kernel.modules, target_is_directory=True)
    (directory / "boot").mkdir()
    (directory / "boot" / f"vmlinuz-{kernel.release}").symlink_to(kernel.image)
    (directory / "boot" / f"config-{kernel.release}").symlink_to(kernel.config)
    return directory


def test_debian_modules_verify_on_their_own_kernel(kernel: Kernel, tmp_path: Path) -> None:
    """`modstage verify --kernel-keys` accepts Debian's own signed modules (the sample, and
    6.12's and 7.2's drivers/misc/c2port/core.ko.xz, whose name modules.builtin.modinfo gives
    kfence's parameters) against their kernel's files, trusting nothing but the certificate
    it reads from the kernel's image (the one the test bed finds by its common name): the
    image, config and exports are found where the packages put them (for 7.2 in
    /usr/lib/modules/<release>, as the notes say), and the kernel's facts (7.2: no
    modversions) are its own."""
    from service.cli import main
    from service.verify.targetkernel.kimage import builtin_certificates

    image = kernel.vmlinux().read_bytes()
    at, length = find_builtin_cert(image)
    assert builtin_certificates(image) == [image[at : at + length]]
    root = _target_root(kernel, tmp_path / "root")
    paths = _sample(kernel)
    c2port = kernel.modules / "kernel/drivers/misc/c2port/core.ko.xz"
    if c2port.exists():
        paths.append(c2port)
    paths = _in_load_order(paths)
    out = io.StringIO()
    argv = ["verify", "--root", str(root), "--kernel", kernel.release, "--kernel-keys"]
    code = main([*argv, *map(str, paths)], out)
    lines = out.getvalue().splitlines()
    assert [line for line in lines if not line.startswith(("ok ", "note: "))] == []
    assert code == 0 and len([line for line in lines if line.startswith("ok ")]) == len(paths)
    where = "usr/lib/modules" if kernel.series == "7.2" else "boot"
    assert any(f"{root}/{where}" in line for line in lines if line.startswith("note: symbols"))
    assert any("1 certificate(s) built into" in line for line in lines)
    target = Target.from_layout(Layout(root), kernel.release)
    assert str(root / where) in target.config.source
    assert target.modversions is (kernel.series != "7.2")


def _unlike_symvers(
    kernel: Kernel, exports: Mapping[str, Export], rows: list[list[str]]
) -> list[str]:
    """The Module.symvers `rows` (crc, name, owner, kind, namespace) whose symbol `exports`
    lacks or gives another GPL-only flag, namespace or CRC (none without modversions)."""
    wrong = []
    for crc, name, owner, kind, namespace in rows:
        mine = exports.get(name)
        expected = (
            kind == "EXPORT_SYMBOL_GPL",
            namespace,
            None if kernel.series == "7.2" else int(crc, 16),
        )
        if mine is None or (mine.gpl, mine.namespace, mine.crc) != expected:
            wrong.append(f"{owner} {name}: {mine} vs {crc} {kind} {namespace!r}")
    return wrong


def test_image_exports_read_as_module_symvers_lists_them(kernel: Kernel) -> None:
    """Every vmlinux export the kernel's headers list in Module.symvers, and every export of
    every 20th in-tree module, is read from the image or the module file with the same
    GPL-only flag (`__ksymtab_gpl` on 6.1 and 6.12, bit 0 of the `__kflagstab` byte on 7.2)
    and namespace, and with its CRC where the kernel has modversions (7.2 has none: every
    CRC is absent, and Module.symvers says 0x00000000)."""
    from service.verify.targetkernel.kimage import read_image

    image = read_image(kernel.image)
    exports = image.exports
    assert image.kflagstab is (kernel.series == "7.2")
    assert image.module_namespaces is (kernel.series == "7.2")
    symvers = kernel.root / f"usr/src/linux-headers-{kernel.release}/Module.symvers"
    listed = [line.split("\t") for line in symvers.read_text().splitlines()]
    vmlinux = [row for row in listed if row[2] == "vmlinux"]
    assert len(vmlinux) > 10000
    assert {crc for crc, *_ in vmlinux} != {"0x00000000"} or kernel.series == "7.2"
    wrong = _unlike_symvers(kernel, exports, vmlinux)
    from service.verify.targetkernel.exports import read_module_exports

    by_owner: dict[str, list[list[str]]] = {}
    for row in listed:
        by_owner.setdefault(row[2], []).append(row)
    checked = 0
    for path in in_tree(kernel.modules)[::20]:
        rows = by_owner.get(str(path.relative_to(kernel.modules / "kernel")).split(".ko")[0], [])
        checked += len(rows)
        wrong += _unlike_symvers(kernel, read_module_exports(path), rows)
    assert checked > 200 and wrong == []


def test_a_certificate_not_followed_by_its_length_is_not_the_builtin_list(kernel: Kernel) -> None:
    """The built-in list is found by its shape alone: with the length that follows it
    changed, the same certificate is no longer taken for the list (a certificate elsewhere in
    an image, a self-test's, is not trusted), and `--kernel-keys` says which image has none."""
    from service.verify.targetkernel.kimage import builtin_certificates

    image = bytearray(kernel.vmlinux().read_bytes())
    at, length = find_builtin_cert(bytes(image))
    quad = (at + length + 7) & ~7
    image[quad : quad + 8] = (length + 1).to_bytes(8, "little")
    with pytest.raises(ValueError, match="no built-in certificate list"):
        builtin_certificates(bytes(image))


def test_a_module_exporting_without_flags_is_refused_where_the_image_has_them(
    kernel: Kernel, tmp_path: Path
) -> None:
    """7.2's loader refuses a module that exports symbols without `__kflagstab` (ENOEXEC, "no
    flags for exported symbols"; check_export_symbol_sections) because its vmlinux has one:
    the test bed's exporting module, built against the kernel's headers, with that section
    renamed is refused against 7.2's files, and as built it is not; its loader also refuses
    an explicit import of a `module:` namespace (EPERM, setup_modinfo; kernel-judged in the
    oracle). 6.1 and 6.12 have no flags table, and their loaders ask for none."""
    from service.errors import ModuleRejected
    from service.verify.loadrules import load_rules
    from service.verify.modfile.modinfo import ModInfo
    from tests.oracle import elf
    from tests.vm.harness import kmod

    built = kmod.build_modules(kernel)["ms_exporter"].read_bytes()
    target = Target.from_layout(Layout(_target_root(kernel, tmp_path / "root")), kernel.release)
    load_rules(ModInfo.from_bytes(built, 62), target)  # as built: refused by no rule
    if kernel.series != "7.2":
        assert not elf.has_section(built, "__kflagstab")
        return
    description = b"description=modstage test: symbol exporter\0"
    importing = built.replace(description, b"import_ns=module:kvm".ljust(len(description), b"\0"))
    with pytest.raises(ModuleRejected, match="EPERM: module tries to import module namespace"):
        load_rules(ModInfo.from_bytes(importing, 62), target)
    name = int(elf.sections(built)[elf.index_of(built, "__kflagstab")]["name"])
    renamed = elf.set_section(built, "__kflagstab", name=name + 2)  # "kflagstab": another name
    with pytest.raises(ModuleRejected, match="ENOEXEC: no flags for exported symbols"):
        load_rules(ModInfo.from_bytes(renamed, 62), target)

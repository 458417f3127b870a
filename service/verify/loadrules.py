"""The kernel's load-time rules after ``.modinfo`` is read, and modstage's policies on them.

In ``load_module``'s order: the rest of the ELF validation, what 6.4's ``elf_validity_check``
adds to 6.1's (:attr:`~service.verify.modfile.elf.Elf.problem_6_4`) and what 6.12's
``elf_validity_cache_copy`` adds (:attr:`~service.verify.modfile.elf.Elf.strict_problem`),
and the size of ``.gnu.linkonce.this_module`` (checked from 6.4 on; 6.1 crashes on a short
one), the ``module_layout`` CRC
(``check_modstruct_version``), vermagic (``check_modinfo``), ``STRICT_MODULE_RWX``
(``module_enforce_rwx_sections``), symbol resolution (``simplify_symbols``, see
:mod:`service.verify.linking`), then the module's BTF (``prepare_coming_module``'s
notifier, :mod:`service.verify.modfile.btf`), then a module that is built into the target
(``mod_sysfs_init``). Symbol resolution may wait for the bundle: an import the target does
not export can come from a module loaded before it (:func:`finish`).
"""

from __future__ import annotations

from collections.abc import Mapping

from service.errors import ModuleRejected, Refusal
from service.verify.linking import Failure, Linkage, Rules, last, resolve, visible
from service.verify.modfile.modinfo import ModInfo, same_magic
from service.verify.modfile.symtab import Export
from service.verify.targetkernel.kernel import Target
from stager.schema.paths import normalize_module_name


def load_rules(info: ModInfo, target: Target) -> Linkage | None:
    """Raise :class:`ModuleRejected` for the first rule ``info`` breaks on ``target``.

    When the module's symbol table was read, returns what is left to judge: the rest
    of symbol resolution and the rules after it, which :func:`finish` judges with the
    exports of the bundle's modules loaded before it. Else (boot) returns None.
    """
    if info.elf_strict is not None and target.rules.elf_6_12:
        raise ModuleRejected("ENOEXEC", f"{info.elf_strict} (6.12's ELF validation)")
    if info.elf_6_4 is not None and target.rules.elf_6_4:
        raise ModuleRejected("ENOEXEC", f"{info.elf_6_4} (6.4's ELF validation)")
    _struct_module(info, target)
    if target.modversions is not False:
        check_crcs(info, target.exports, layout=True)
    check_vermagic(info, target)
    if info.write_exec is not None and target.rules.strict_rwx:
        raise ModuleRejected(
            "ENOEXEC", f"section {info.write_exec} is writable and executable (STRICT_MODULE_RWX)"
        )
    _export_sections(info, target)
    if info.symbols is None:  # boot: the kernel resolves; only CRCs already known are judged
        if target.modversions is not False:
            check_crcs(info, target.exports, layout=False)
        _btf(info, target)
        _builtin(info, target)
        return None
    failures = [] if info.symbols.problem is None else [_problem(info.symbols.problem)]
    found, left = resolve(info, info.symbols.imports, target.exports, _rules(target), final=False)
    disagree = target.exports.table.disagree
    failures += [
        Failure(imp.at, Refusal("EINVAL", f"the target's files disagree about the CRC of "
                                f"{imp.name}: {disagree[imp.name]}", policy=True))
        for imp in info.symbols.imports
        if imp.name in disagree
    ]  # fmt: skip
    return Linkage(info, (*failures, *found), left, info.symbols.exports)


def finish(
    linkage: Linkage, target: Target, bundle: Mapping[str, Export], *, open_ended: bool = False
) -> None:
    """Judge what :func:`load_rules` left with ``bundle`` (the exports of the modules loaded
    before this one), then the rules that follow symbol resolution. ``open_ended``: other
    modules, not known here, load before it: imports still unresolved are not judged."""
    info = linkage.info
    failures = list(linkage.failures)
    bundle = visible(bundle, target.rules)
    if linkage.unresolved:
        found, left = resolve(info, linkage.unresolved, bundle, _rules(target), final=False)
        failures += found
        if left and open_ended:
            pass  # exported, perhaps, by a bundle not taken in yet: the kernel judges
        elif left and target.exports.complete:
            failures += resolve(info, left, {}, _rules(target), final=True)[0]
        elif left and target.strict_crcs:
            failures.append(_unknown(left[-1].at, len(left), left[0].name, target))
        # else: nothing more is known of the target's exports; the kernel judges the rest
    refusal = last(failures)
    if refusal is not None:
        raise refusal
    _btf(info, target)
    _builtin(info, target)


def _btf(info: ModInfo, target: Target) -> None:
    """``btf_module_notify`` of a kernel that reads module BTF and lets no mismatch pass."""
    rules = target.rules
    if info.btf is None or not rules.module_btf or rules.btf_mismatch_allowed:
        return
    errno, why = info.btf
    raise ModuleRejected(
        errno,
        f"its .BTF fails the kernel's module BTF parser: {why} "
        "(CONFIG_MODULE_ALLOW_BTF_MISMATCH is not set)",
    )


def _export_sections(info: ModInfo, target: Target) -> None:
    """``check_export_symbol_sections`` and ``setup_modinfo`` of a kernel whose image says it
    has them (judged where the target's exports are read; boot leaves them to the kernel):
    with ``__kflagstab`` in vmlinux (7.2) a module exporting symbols without one is ENOEXEC;
    where the loader knows ``module:`` namespaces, a module importing one is EPERM."""
    if not target.links or target.exports.sources is None:
        return
    table = target.exports.table
    if table.kflagstab and info.exports_symbols and not info.kflagstab:
        raise ModuleRejected(
            "ENOEXEC",
            "no flags for exported symbols (no __kflagstab; the target's exports have one)",
        )
    if table.module_namespaces:
        for namespace in sorted(info.import_ns):
            if namespace.startswith("module:"):
                raise ModuleRejected(
                    "EPERM", f"module tries to import module namespace: {namespace}"
                )


def _rules(target: Target) -> Rules:
    return Rules(
        target.rules.force_load,
        target.rules.missing_ns_ok,
        target.modversions is not False,  # unknown: CRCs are compared where known
        bool(target.exports.sources is not None and target.exports.table.module_namespaces),
    )


def _problem(problem: tuple[int, str]) -> Failure:
    return Failure(problem[0], Refusal("ENOEXEC", problem[1]))


def _unknown(at: int, count: int, first: str, target: Target) -> Failure:
    why = (
        f"{count} imported symbols are not among the target's known exports (e.g. {first}; "
        f"{target.exports.describe()}); the kernel refuses an unknown symbol (ENOENT) or a "
        "CRC mismatch (EINVAL)"
    )
    return Failure(at, Refusal("EINVAL", why, policy=True))


def _struct_module(info: ModInfo, target: Target) -> None:
    size, expected = info.this_module_size, target.struct_module
    if size is None or expected is None or size == expected:
        return
    said = (
        f".gnu.linkonce.this_module is {size} bytes, not sizeof(struct module) = {expected} "
        "(as in the target's in-tree modules)"
    )
    if target.rules.elf_6_4:
        raise ModuleRejected("ENOEXEC", f"{said}")
    raise ModuleRejected(
        "ENOEXEC",
        f"safety: {said}; Linux {target.release} does not check this size "
        "and may crash loading the module (a short one oopses in add_kallsyms)",
        policy=True,
    )


def _builtin(info: ModInfo, target: Target) -> None:
    """``mod_sysfs_init``: a module may not take a name built-in code has under /sys/module.

    The running kernel's /sys/module is the whole answer. The image's tables name the
    entries made at boot, but not those a built-in driver adds when it registers under its
    module name: a ``modules.builtin`` name the image does not list is refused (policy)."""
    name = normalize_module_name(info.module_name or "")
    names, source = target.sysfs_names()
    if names is not None and name in names:
        raise ModuleRejected(
            "EINVAL",
            f"module {name} has a /sys/module entry made by built-in code (read from "
            f"{source}): mod_sysfs_init refuses it (module is already loaded)",
        )
    if name in target.builtin and (names is None or target.builtin_sysfs is None):
        raise ModuleRejected(
            "EINVAL",
            f"module {name} is built into the target kernel (modules.builtin); the kernel "
            "refuses it (EINVAL) when the built-in has a /sys/module entry, which "
            + (
                "a built-in driver adds when it registers"
                if names is not None
                else "could not be read (neither the running kernel's /sys/module nor the image)"
            ),
            policy=True,
        )


def check_crcs(info: ModInfo, exports: Mapping[str, Export], *, layout: bool) -> None:
    """``check_version`` for the symbols whose CRC the target is known to export.

    ``layout``: only ``module_layout`` (``check_modstruct_version``: ENOEXEC, checked before
    vermagic); else every other ``__versions`` entry (``resolve_symbol``: EINVAL, after
    it), as boot judges without reading the module's symbol table.
    """
    for name, crc in info.versions:
        if (name == "module_layout") != layout:
            continue
        export = exports.get(name)
        if export is None or export.crc is None or crc == export.crc:
            continue
        code = "ENOEXEC" if layout else "EINVAL"
        raise ModuleRejected(
            code,
            f"disagrees about version of symbol {name} (module {crc:#x}, target {export.crc:#x})",
        )


def check_vermagic(info: ModInfo, target: Target) -> None:
    """``check_modinfo``'s vermagic rule for ``target``, plus modstage's policies.

    The kernel compares the module's vermagic with its own by :func:`same_magic`.
    Policies (the kernel would accept): a module without vermagic is refused although a
    kernel with ``MODULE_FORCE_LOAD=y`` force-loads it tainted; a module built for another
    release only where the kernel's own rule is known to be applied (:func:`_built_for`);
    without the target's full vermagic nothing is accepted, as ``same_magic`` cannot be
    applied.
    """
    if info.vermagic is None:
        if target.rules.force_load:
            raise ModuleRejected(
                "ENOEXEC",
                "no vermagic in .modinfo; the target (MODULE_FORCE_LOAD=y) "
                "would force-load it and taint",
                policy=True,
            )
        raise ModuleRejected("ENOEXEC", "no vermagic in .modinfo and no MODULE_FORCE_LOAD")
    crcs = info.has_versions and target.modversions is not False
    if target.vermagic is not None and not same_magic(info.vermagic, target.vermagic, crcs):
        raise ModuleRejected(
            "ENOEXEC",
            f"vermagic {info.vermagic!r} does not match the target's "
            f"{target.vermagic!r} (from {target.vermagic_source})",
        )
    _built_for(info.vermagic.split(" ", 1)[0], target, crcs=crcs)
    if target.vermagic is None:
        raise ModuleRejected(
            "ENOEXEC",
            f"cannot apply same_magic: target vermagic {target.vermagic_source}",
            policy=True,
        )


def _built_for(built_for: str, target: Target, *, crcs: bool) -> None:
    """A module built for release ``built_for``: without symbol CRCs (``crcs``) the kernel
    compares the whole vermagic, release included; with them it compares CRCs instead, so
    the release word must still equal the target's (policy) where modstage cannot tell
    whether it has modversions, or cannot read the exports to compare the CRCs itself."""
    if built_for == target.release:
        return
    if not crcs:  # same_magic compares the whole string, release included
        raise ModuleRejected("ENOEXEC", f"vermagic is for kernel {built_for}, not {target.release}")
    if target.modversions is None:
        raise ModuleRejected(
            "ENOEXEC",
            f"vermagic is for kernel {built_for}, not {target.release}; without the "
            "target's config it is not known whether the kernel has modversions (then "
            "same_magic skips the release) or compares the whole vermagic",
            policy=True,
        )
    if target.strict_crcs and not target.exports.complete:
        raise ModuleRejected(
            "ENOEXEC",
            f"vermagic is for kernel {built_for}, not {target.release} "
            "(with modversions the kernel compares symbol CRCs instead, and the target's "
            "exports could not be read to do the same)",
            policy=True,
        )

"""The kernel's symbol resolution (``simplify_symbols``), judged before the reboot.

For every undefined symbol in ``.symtab`` order, ``resolve_symbol`` (Linux 6.1 and 6.12):

1. ``find_symbol``: the export by name in vmlinux, then in the loaded modules; a GPL-only
   export is invisible to a module whose license is not GPL-compatible
   (``license_is_gpl_compatible``; no license counts as "unspecified"). Not found:
   ``ENOENT`` ("Unknown symbol"), unless the symbol is weak.
2. ``check_version`` (only with ``CONFIG_MODVERSIONS``; without it, as on Debian's 7.2,
   symbols resolve by name alone): an export with a CRC against the module's
   ``__versions``: a mismatch, or (Debian's patch) no entry for the symbol, is ``EINVAL``; a
   module with no ``__versions`` at all is force-loaded only with ``MODULE_FORCE_LOAD``
   (else ``EINVAL``).
3. ``verify_namespace_is_imported``: a namespaced export needs ``import_ns=<ns>`` in
   ``.modinfo``, else ``EINVAL`` (unless ``MODULE_ALLOW_MISSING_NAMESPACE_IMPORTS``). Where
   the loader knows ``module:<names>`` namespaces (``EXPORT_SYMBOL_FOR_MODULES``: 7.2, not
   Debian's 6.12, which exports in one without knowing it; read from the image), such a
   namespace needs no import: it admits the modules its comma-separated names match (``-``
   and ``_`` alike, a trailing ``*`` a prefix; ``verify_module_namespace``).

``simplify_symbols`` does not stop at a failure: the load fails with the error of the
*last* failing symbol, which is the one named here. A bundle's own exports are resolved in
its load order (a module sees the exports of the modules loaded before it).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import NamedTuple

from service.errors import ModuleRejected, Refusal
from service.verify.modfile.modinfo import ModInfo
from service.verify.modfile.symtab import Export, Import
from service.verify.targetkernel.rules import KernelRules

GPL_COMPATIBLE = frozenset(
    ("GPL", "GPL v2", "GPL and additional rights", "Dual BSD/GPL", "Dual MIT/GPL", "Dual MPL/GPL")
)


class Failure(NamedTuple):
    """One symbol the kernel would not resolve, at its place in ``.symtab``."""

    at: int  # its index in .symtab
    refusal: Refusal


class Linkage(NamedTuple):
    """What is left to judge of a module once the target's own exports were looked up."""

    info: ModInfo
    failures: tuple[Failure, ...]  # found so far, in .symtab order
    unresolved: tuple[Import, ...]  # imports the target does not export (a bundle may)
    exports: Mapping[str, Export]  # the module's own exports, for the modules after it


def visible(exports: Mapping[str, Export], rules: KernelRules) -> Mapping[str, Export]:
    """The modules' ``exports`` a kernel with ``rules`` resolves against: where
    ``find_module_sections`` ignores ``__ksymtab_gpl`` (7.1 on, ``gpl_section_ignored``),
    not those a module exports there."""
    if not rules.gpl_section_ignored or not any(e.gpl_section for e in exports.values()):
        return exports
    return {name: e for name, e in exports.items() if not e.gpl_section}


class Rules(NamedTuple):
    """The target's settings symbol resolution depends on, as plain values: taken from its
    :class:`~service.verify.targetkernel.rules.KernelRules` and, for ``module:`` namespaces, its
    image (:mod:`service.verify.loadrules` makes them)."""

    force_load: bool  # CONFIG_MODULE_FORCE_LOAD
    missing_ns_ok: bool  # CONFIG_MODULE_ALLOW_MISSING_NAMESPACE_IMPORTS
    modversions: bool = True  # CONFIG_MODVERSIONS: without it no CRC is ever compared
    module_namespaces: bool = False  # the loader admits the modules a module: namespace names


def gpl_compatible(info: ModInfo) -> bool:
    """Whether the kernel lets ``info``'s module use GPL-only exports."""
    return (info.license or "unspecified") in GPL_COMPATIBLE


def judge(info: ModInfo, imp: Import, export: Export | None, rules: Rules) -> Refusal | None:
    """Why ``resolve_symbol`` fails for ``imp`` given the ``export`` found (None: found none)."""
    if export is None or (export.gpl and not gpl_compatible(info)):
        if imp.weak:
            return None
        if export is None:
            return Refusal("ENOENT", f"Unknown symbol {imp.name} (no export of that name)")
        return Refusal(
            "ENOENT",
            f"Unknown symbol {imp.name} (GPL-only export of {export.owner}; the "
            f"module's license {info.license or 'unspecified'!r} is not GPL-compatible)",
        )
    if export.crc is not None and rules.modversions:
        if not info.has_versions:
            if not rules.force_load:
                return Refusal(
                    "EINVAL", f"no __versions to check {imp.name} and no MODULE_FORCE_LOAD"
                )
        else:
            crc = info.crc_of.get(imp.name)
            if crc is None:
                return Refusal("EINVAL", f"no symbol version for {imp.name} (not in __versions)")
            if crc != export.crc:
                return Refusal(
                    "EINVAL",
                    f"disagrees about version of symbol {imp.name} "
                    f"(module {crc:#x}, target {export.crc:#x}, {export.owner})",
                )
    if (
        export.namespace
        and export.namespace not in info.import_ns
        and not rules.missing_ns_ok
        and not (
            rules.module_namespaces
            and module_namespace_admits(export.namespace, info.module_name or "")
        )
    ):
        return Refusal(
            "EINVAL",
            f"module uses symbol {imp.name} from namespace {export.namespace}, "
            "but does not import it (no MODULE_IMPORT_NS)",
        )
    return None


def module_namespace_admits(namespace: str, module: str) -> bool:
    """``verify_module_namespace``: whether a ``module:`` namespace names ``module``."""
    if not namespace.startswith("module:"):
        return False
    wanted = module.replace("-", "_")
    for pattern in namespace[len("module:") :].split(","):
        pattern = pattern.replace("-", "_")
        if pattern.endswith("*") and wanted.startswith(pattern[:-1]):
            return True
        if pattern and pattern == wanted:
            return True
    return False


def resolve(
    info: ModInfo,
    imports: tuple[Import, ...],
    exports: Mapping[str, Export],
    rules: Rules,
    *,
    final: bool,
) -> tuple[list[Failure], tuple[Import, ...]]:
    """Judge ``imports`` against ``exports``: (failures, imports left unresolved).

    ``final``: a symbol not found fails now; else it is left for the bundle's exports.
    """
    failures, left = [], []
    for imp in imports:
        export = exports.get(imp.name)
        if export is None and not final:
            left.append(imp)
            continue
        why = judge(info, imp, export, rules)
        if why is not None:
            failures.append(Failure(imp.at, why))
    return failures, tuple(left)


def last(failures: list[Failure] | tuple[Failure, ...]) -> ModuleRejected | None:
    """The refusal ``simplify_symbols`` returns: its last failing symbol's (a policy only
    when the kernel itself would resolve every symbol)."""
    kernel = [f for f in failures if not f.refusal.policy]
    if not failures:
        return None
    return ModuleRejected.of(max(kernel or failures).refusal)

"""The loader's symbol resolution (``service.verify.linking``) on plain values: which import
``resolve_symbol`` refuses and why, what is left for a bundle's exports, and which failure
``simplify_symbols`` returns."""

from __future__ import annotations

from dataclasses import replace

from service.errors import Refusal
from service.verify.linking import Failure, Rules, judge, last, module_namespace_admits, resolve
from service.verify.modfile.modinfo import ModInfo
from service.verify.modfile.symtab import Export, Import

STRICT = Rules(force_load=False, missing_ns_ok=False)
SYM = Import(7, "sym", False)


def module(
    license: str | None = "GPL", versions: dict[str, int] | None = None, name: str = "m"
) -> ModInfo:
    """A module of ``license`` with ``__versions`` (when ``versions`` is not None)."""
    fields = [("license", license)] if license is not None else []
    info = ModInfo.from_fields(fields, 62, versions is not None)
    return replace(info, versions=tuple((versions or {}).items()), module_name=name)


def test_rules_default_to_modversions_on_and_no_module_namespaces() -> None:
    """A target's rules compare CRCs unless told otherwise (``CONFIG_MODVERSIONS``), and
    admit no module by a ``module:`` namespace unless the loader has that check."""
    rules = Rules(force_load=False, missing_ns_ok=False)
    assert rules.modversions and not rules.module_namespaces
    mismatch = judge(module(versions={"sym": 1}), SYM, Export(2, False, "", "vmlinux"), rules)
    assert mismatch is not None and mismatch.errno == "EINVAL"
    named = judge(module(name="kvm"), SYM, Export(None, False, "module:kvm", "vmlinux"), rules)
    assert named is not None and named.errno == "EINVAL"


def test_a_symbol_no_one_exports_is_unknown_unless_the_import_is_weak() -> None:
    """No export: ENOENT naming the symbol as not exported; a weak import resolves to nothing
    and is no failure."""
    refused = judge(module(), SYM, None, STRICT)
    assert refused == Refusal("ENOENT", "Unknown symbol sym (no export of that name)")
    assert judge(module(), Import(7, "sym", True), None, STRICT) is None


def test_a_gpl_only_export_is_unknown_to_a_module_that_is_not_gpl_compatible() -> None:
    """A GPL-only export resolves for a GPL module; for a proprietary one, or one that states
    no license ("unspecified"), it is ENOENT naming the exporter and the license; a weak
    import of it resolves to nothing."""
    gpl_only = Export(None, True, "", "owner_mod")
    assert judge(module("GPL"), SYM, gpl_only, STRICT) is None
    for license, shown in (("Proprietary", "'Proprietary'"), (None, "'unspecified'")):
        refused = judge(module(license), SYM, gpl_only, STRICT)
        assert refused is not None and refused.errno == "ENOENT"
        assert "GPL-only export of owner_mod" in refused.message
        assert f"license {shown} is not GPL-compatible" in refused.message
    assert judge(module("Proprietary"), Import(7, "sym", True), gpl_only, STRICT) is None


def test_crcs_are_compared_only_when_the_export_has_one_and_the_target_checks() -> None:
    """With a CRC and modversions: the module's own CRC must be in ``__versions`` and equal;
    a module without ``__versions`` needs MODULE_FORCE_LOAD. An export without a CRC, or a
    target without modversions, checks nothing."""
    crc = Export(0x1234, False, "", "vmlinux")
    assert judge(module(versions={"sym": 0x1234}), SYM, crc, STRICT) is None
    other = judge(module(versions={"sym": 0x9999}), SYM, crc, STRICT)
    assert other is not None and other.errno == "EINVAL"
    assert "disagrees about version of symbol sym" in other.message
    missing = judge(module(versions={"else": 0x1234}), SYM, crc, STRICT)
    assert missing is not None and "no symbol version for sym" in missing.message
    unversioned = judge(module(), SYM, crc, STRICT)
    assert unversioned is not None and "no MODULE_FORCE_LOAD" in unversioned.message
    assert judge(module(), SYM, crc, STRICT._replace(force_load=True)) is None
    assert judge(module(versions={"sym": 0x9999}), SYM, crc._replace(crc=None), STRICT) is None
    no_modversions = STRICT._replace(modversions=False)
    assert judge(module(versions={"sym": 0x9999}), SYM, crc, no_modversions) is None
    assert judge(module(), SYM, crc, no_modversions) is None


def test_a_glob_names_the_modules_its_prefix_starts() -> None:
    """``module:dax_*`` admits exactly the modules beginning ``dax_`` (not ``daxhmem``, not
    ``kvm``); a namespace that is not ``module:`` admits none."""
    assert module_namespace_admits("module:dax_*", "dax_hmem")
    assert not module_namespace_admits("module:dax_*", "daxhmem")
    assert not module_namespace_admits("module:dax_*", "kvm")
    assert not module_namespace_admits("dax_*", "dax_hmem")


def test_resolve_leaves_unknown_symbols_for_the_bundle_until_final() -> None:
    """Not final: an import the exports lack is left unresolved (no failure), a found one is
    judged; final: the lacking one fails ENOENT at its ``.symtab`` index."""
    found, lacking = Import(3, "found", False), Import(5, "lacking", False)
    proprietary = module("Proprietary")
    exports = {"found": Export(None, True, "", "vmlinux")}
    failures, left = resolve(proprietary, (found, lacking), exports, STRICT, final=False)
    assert left == (lacking,)
    assert [f.at for f in failures] == [3]
    failures, left = resolve(proprietary, (found, lacking), exports, STRICT, final=True)
    assert left == ()
    assert [(f.at, f.refusal.errno) for f in failures] == [(3, "ENOENT"), (5, "ENOENT")]
    assert resolve(module(), (found,), exports, STRICT, final=True) == ([], ())


def test_the_refusal_is_the_last_failing_symbols_and_a_policy_only_when_all_are() -> None:
    """No failure: None. Otherwise the failure latest in ``.symtab`` among the kernel's own
    refusals wins over any later policy refusal; policy refusals alone give the latest."""
    kernel = [Failure(2, Refusal("ENOENT", "two")), Failure(4, Refusal("EINVAL", "four"))]
    policy = [Failure(9, Refusal("EINVAL", "nine", policy=True))]
    assert last([]) is None
    chosen = last(kernel + policy)
    assert chosen is not None and chosen.refusal == kernel[1].refusal
    only = last([*policy, Failure(1, Refusal("EINVAL", "one", policy=True))])
    assert only is not None and only.refusal == policy[0].refusal and only.refusal.policy

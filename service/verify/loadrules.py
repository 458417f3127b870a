"""The kernel's load-time rules after ``.modinfo`` is read, and modstage's policies on them.

In ``load_module``'s order: the ``module_layout`` CRC, vermagic (``check_modinfo``),
``STRICT_MODULE_RWX`` (``module_enforce_rwx_sections``), the other imported symbols'
CRCs, then a module that is built into the target (``mod_sysfs_init``).
"""

from __future__ import annotations

from service.errors import ModuleRejected
from service.verify.modinfo import ModInfo, check_crcs, check_vermagic
from service.verify.target import Target


def load_rules(info: ModInfo, target: Target) -> None:
    """Raise :class:`ModuleRejected` for the first rule ``info`` breaks on ``target``."""
    check_crcs(info, target.crcs, layout=True)
    check_vermagic(info, target)
    if info.write_exec is not None and target.config.enabled("STRICT_MODULE_RWX"):
        raise ModuleRejected(
            f"ENOEXEC: section {info.write_exec} is writable and executable (STRICT_MODULE_RWX)"
        )
    check_crcs(info, target.crcs, layout=False)
    unknown = [n for n, _crc in info.versions if n not in target.crcs]
    if unknown and target.strict_crcs and not target.crcs_complete:
        raise ModuleRejected(
            f"EINVAL (policy): the target's CRCs of {len(unknown)} imported symbols are unknown "
            f"(e.g. {unknown[0]}): no build/Module.symvers under lib/modules/{target.release}; "
            "the kernel refuses a CRC mismatch with EINVAL"
        )
    name = (info.module_name or "").replace("-", "_")
    if name in target.builtin_sysfs:
        raise ModuleRejected(
            f"EINVAL: module {name} is built into the target kernel with a /sys/module entry "
            "(parameters or version in modules.builtin.modinfo): mod_sysfs_init refuses it"
        )
    if name in target.builtin:
        raise ModuleRejected(
            f"EINVAL (policy): module {name} is built into the target kernel (modules.builtin); "
            "the kernel refuses it (EINVAL) when the built-in has a /sys/module entry"
        )

"""What the host refuses in a drop by its bundle's ``[bundles.<name>]`` table (pure).

A trusted vendor key can sign any module under any name. ``modstage boot`` loads a
generation early in boot, before most in-tree modules: a drop's module named like one of
the target kernel's own (``nvme``, ``mlx5_core``, ``crc8``) takes that name, and the
kernel's module never loads (modprobe finds the name taken). So a drop module whose name
the target kernel's tree or ``modules.builtin`` has (:mod:`service.verify.targetkernel.intree`)
is refused unless ``shadow_in_tree`` allows that name; where ``modules`` names globs, a
module no glob matches is refused too. A module's name is the one the kernel registers
(``struct module``'s, from the verdict), else the file's; names compare ``-`` and ``_``
alike, as the kernel does.

Where ``signers`` names certificates, a module signed by any other trusted key is refused:
``trusted.d`` is one set for every bundle, and without it a certificate trusted for one
vendor's bundle would make the host take anything it signed under any bundle name. An entry
names a certificate by its file name in ``trusted.d`` or by one of the key ids the kernel
files it under (its subjectKeyIdentifier, or its serial and issuer: what a module's
signature names and ``modstage verify --json`` prints as ``key_id``).

Where ``params`` names globs, a module parameter of the drop no glob matches is refused
(beside the host's ``forbidden_params``, which no bundle may set).

A drop whose manifest version orders below ``min_version`` (Debian's order,
:func:`~service.host.installed.compare_versions`) is refused, unless it is the bundle's
active or pending generation already: an admin's rollback below the floor, which the
driver's pod then stages again, stands (``modstage rollback`` itself is not judged here).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Collection, Sequence
from pathlib import Path

from service.bundlepolicy import BundlePolicy, key_identifier, name_matches
from service.host.installed import compare_versions
from service.verify.signature.trust import TrustedKey, TrustStore
from stager.schema.manifest import ModuleEntry
from stager.schema.params import parse_params
from stager.schema.paths import normalize_module_name


def name_problems(
    modules: Sequence[tuple[str, str]],
    *,
    bundle: str,
    policy: BundlePolicy,
    in_tree: Callable[[str], str | None],
    builtin: Collection[str],
) -> list[str]:
    """Each module of a drop whose name the bundle may not carry: one that would take the
    name of one of the target kernel's own modules (naming that module), or that no glob of
    ``modules`` matches when it has some; each problem names the file and the key.

    ``modules``: (file in the drop, the module's name) of each; ``in_tree``: the path (as
    the host names it) of the target's in-tree module of a name, or None; ``builtin``: the
    names of ``modules.builtin``.
    """
    problems = []
    for file, name in modules:
        name = normalize_module_name(name)
        if policy.modules and not name_matches(policy.modules, name):
            problems.append(
                f"{file}: module {name} matches none of [bundles.{bundle}] modules = "
                f"{json.dumps(list(policy.modules))}"
            )
        found = in_tree(name)
        if found is not None:
            theirs = f"in-tree module {found}"
        elif name in builtin:
            theirs = f"module {name}, built in (modules.builtin)"
        else:
            continue
        if name_matches(policy.shadow_in_tree, name):
            continue
        problems.append(
            f"{file}: module {name} would take the place of the target kernel's {theirs}; "
            f"[bundles.{bundle}] shadow_in_tree does not name it"
        )
    return problems


def below_floor(version: str, bundle: str, policy: BundlePolicy) -> str | None:
    """Why ``version`` is below the bundle's ``min_version``, naming both, or None."""
    floor = policy.min_version
    if floor is None or compare_versions(version, floor) >= 0:
        return None
    return (
        f"version {version} orders below [bundles.{bundle}] min_version = "
        f"{json.dumps(floor)} (Debian's version order)"
    )


def unlisted_params(modules: Sequence[ModuleEntry], bundle: str, policy: BundlePolicy) -> list[str]:
    """Each parameter a drop's modules set that no glob of the bundle's ``params`` matches,
    naming the module's file, the parameter and the globs (none when ``params`` is empty)."""
    if not policy.params:
        return []
    globs = json.dumps(list(policy.params))
    return [
        f"{module.file}: parameter {name} matches none of [bundles.{bundle}] params = {globs}"
        for module in modules
        for name, _value in parse_params(module.params)
        if not name_matches(policy.params, name)
    ]


def signer_allowed(signers: Collection[str], key_id: str, key: TrustedKey | None) -> bool:
    """Whether one of ``signers`` names the signature's key id ``key_id`` (hex) or the
    trusted certificate ``key`` it resolves to (by file name or any of its key ids)."""
    ids = {key_id.lower()} | ({k.hex() for k in key.key_ids} if key is not None else set())
    file = Path(key.source).name if key is not None else None
    return any(s == file or key_identifier(s) in ids for s in signers)


def named_by(entry: str, trust: TrustStore) -> list[TrustedKey]:
    """The trusted certificates a ``signers`` entry names: by file name, or by one of the
    key ids the kernel files the certificate under."""
    ident = key_identifier(entry)
    return [
        k
        for k in trust.keys
        if Path(k.source).name == entry or ident in {i.hex() for i in k.key_ids}
    ]


def signer_of(key_id: str, key: TrustedKey | None) -> str:
    """A signer as a refusal names it: subject, certificate file and key identifier (the
    subjectKeyIdentifier where the certificate has one), else the signature's key id."""
    if key is None:
        return f"key id {key_id}"
    return f"{key.subject!r} ({Path(key.source).name}, key identifier {key.key_ids[-1].hex()})"


def signer_problems(
    signed: Sequence[tuple[str, str | None]],
    *,
    bundle: str,
    policy: BundlePolicy,
    trust: TrustStore,
) -> list[str]:
    """Each module of a drop whose signer the bundle's ``signers`` does not name, naming the
    file, the signer found and the signers allowed (none when ``signers`` is empty).

    ``signed``: (file, the hex key id its signature names) of each module; an unsigned one
    (None) is refused by its verdict already."""
    if not policy.signers:
        return []
    allowed = json.dumps(list(policy.signers))
    problems = []
    for file, key_id in signed:
        if key_id is None:
            continue
        key = trust.find(bytes.fromhex(key_id))
        if not signer_allowed(policy.signers, key_id, key):
            problems.append(
                f"{file}: signed by {signer_of(key_id, key)}; [bundles.{bundle}] signers = "
                f"{allowed} allows only those"
            )
    return problems

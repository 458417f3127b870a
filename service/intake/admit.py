"""What intake asks of a drop before it may become a generation (pure where it can be).

:func:`policy_problems` applies the host's policy to a manifest and the bundle's
state; :func:`verify_copy` verifies the store's copies of the drop's files (digests,
signatures, the target kernel's rules, module order, firmware only of the drop's own
modules: :mod:`service.intake.firmware_names`; module names only as its bundle's table allows,
none in the place of one of the target kernel's own: :mod:`service.intake.bundlerules`;
no verified module whose registered name, nor firmware whose name, another bundle owns:
:mod:`service.intake.owners`) and
asks the running kernel's keyrings what the target kernel will refuse when it enforces
signatures (:func:`preflight`).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from pathlib import Path

from service.bundles.state import BundleState
from service.config import BundlePolicy, Config
from service.host.running import RunningHost
from service.intake.bundlerules import below_floor, name_problems, signer_problems, unlisted_params
from service.intake.firmware_names import firmware_problems
from service.intake.owners import Owners
from service.layout import Layout, modules_dir
from service.verify.bundle import order_problems
from service.verify.modfile.param_check import param_problems
from service.verify.modfile.symtab import Export
from service.verify.signature.keyring import Keyring, enforcing
from service.verify.signature.nextkeys import next_enforcing, next_refusals
from service.verify.signature.trust import TrustStore
from service.verify.targetkernel.intree import in_tree_modules
from service.verify.targetkernel.kernel import Target
from service.verify.verdict import Verdict, verify_files
from stager.schema.manifest import Manifest
from stager.schema.params import parse_params
from stager.schema.paths import normalize_module_name


def bundle_exports(directory: Path, manifest: Manifest) -> dict[str, Export]:
    """The exports of a stored generation's modules (unreadable ones export nothing)."""
    from service.errors import TargetFileError
    from service.verify.targetkernel.exports import read_module_exports

    out: dict[str, Export] = {}
    for module in manifest.modules:
        try:
            out.update(read_module_exports(directory / module.file))
        except TargetFileError:
            continue  # the kernel cannot resolve from a module boot will not load either
    return out


def missing_tree(layout: Layout, release: str) -> tuple[str, str] | None:
    """Why a drop for kernel ``release`` cannot be judged yet (log event, reason), or None:
    the release's module tree (where its vermagic, built-ins and exports are read) is not
    on this host. A kernel not installed yet is no fault of the drop: it waits."""
    tree = modules_dir(layout, release)
    if tree.is_dir():
        return None
    reason = (
        f"{tree} is missing: the target kernel {release} is not installed, so the drop "
        "cannot be judged yet; it waits in incoming until that tree exists"
    )
    return "drop.target_missing", reason


def policy_problems(config: Config, manifest: Manifest, bundle: BundleState) -> list[str]:
    """Every way ``manifest`` breaks the host's policy, or its bundle's state forbids it.

    A version below the bundle's ``min_version`` is refused unless the drop is the bundle's
    active or pending generation already (an admin's rollback below the floor stands)."""
    problems = []
    if config.allowed_bundles and manifest.bundle not in config.allowed_bundles:
        problems.append(f"bundle {manifest.bundle!r} is not allowed on this host")
    if manifest.memory is not None and manifest.memory not in config.allowed_memory_policies:
        problems.append(f"memory policy {manifest.memory.value!r} is not allowed on this host")
    forbidden = {n.replace("-", "_") for n in config.forbidden_params}
    for i, module in enumerate(manifest.modules):
        problems += [f"module[{i}].params: {p}" for p in param_problems(module.params)]
        for name, _value in parse_params(module.params):
            if name.replace("-", "_") in forbidden:
                problems.append(f"module[{i}].params: {name!r} is forbidden on this host")
    policy = config.bundle_policy(manifest.bundle)
    problems += unlisted_params(manifest.modules, manifest.bundle, policy)
    floor = below_floor(manifest.version, manifest.bundle, policy)
    if floor is not None and manifest.digest not in (bundle.active, bundle.pending):
        problems.append(floor)
    failed = bundle.generations.get(manifest.digest)
    if failed is not None and failed.failed:
        problems.append(f"generation {manifest.digest[:12]} already failed: {failed.failed}")
    if failed is not None and failed.rolled_back:
        problems.append(
            f"generation {manifest.digest[:12]} was rolled back by an admin "
            f"({failed.rolled_back}); modstage retry {manifest.bundle} "
            f"{manifest.digest[:12]} brings it back"
        )
    return problems


def claimed_modules(
    modules: Sequence[tuple[str, str]], owners: Mapping[str, tuple[str, str]], *, bundle: str
) -> list[str]:
    """Each module of a drop of ``bundle`` another bundle owns. ``modules``: (file in the
    drop, the name the module registers) of each; ``owners`` maps a registered name to the
    bundle and generation whose active or pending generation loads it
    (:func:`service.intake.owners.module_owners`). Two bundles cannot share a module: the
    kernel loads a name once, and the bundle booted second would fail, or run on the first
    one's parameters (a typo'd bundle name carrying the real bundle's module is the usual case).
    """
    problems = []
    for file, name in modules:
        owner = owners.get(normalize_module_name(name))
        if owner is None or owner[0] == bundle:
            continue
        other, generation = owner
        problems.append(
            f"{file}: module {name!r} belongs to bundle {other!r} (generation "
            f"{generation[:12]}), so bundle {bundle!r} may not carry it: stage it as bundle "
            f"{other!r}, or first modstage forget {other} if that name is the mistake"
        )
    return problems


def verify_copy(
    tmp: Path,
    manifest: Manifest,
    *,
    layout: Layout,
    config: Config,
    trust: TrustStore,
    keyring: Keyring,
    shown: Path,
    before: Mapping[str, Export] | None,
    owners: Owners,
    names: dict[str, str] | None = None,
) -> list[str]:
    """Why the copies under ``tmp`` may not be published (empty: they may).

    ``owners``: the modules and firmware other bundles own; ``names``, when
    given, is filled with the name each module file registers (what intake records).

    ``before``: the exports of the bundles this one loads after (``after``); None when
    one of them is not known yet, so imports no one else exports are left to the kernel.
    """
    target = replace(
        Target.from_layout(layout, manifest.kernel), strict_crcs=config.require_symbol_crcs
    )
    verdicts = verify_files(tmp, manifest, trust=trust, kernel=target, shown=shown, before=before)
    modules = verdicts[: len(manifest.modules)]
    # a module ordered before what it depends on also fails symbol resolution: the
    # order is the reason to give first
    reasons = order_problems(modules)
    reasons += [f"{v.file}: {v.reason}" for v in verdicts if not v.ok]
    policy = config.bundle_policy(manifest.bundle)
    reasons += _bundle_problems(manifest, modules, layout, policy, target, trust, owners, names)
    if not reasons:
        reasons = preflight(layout, keyring, manifest, modules, target, trust)
    return reasons


def _bundle_problems(
    manifest: Manifest,
    modules: list[Verdict],
    layout: Layout,
    policy: BundlePolicy,
    target: Target,
    trust: TrustStore,
    owners: Owners,
    names: dict[str, str] | None,
) -> list[str]:
    """What the host's and the bundle's rules refuse of the verified ``modules``: firmware
    only their own modules declare and no other bundle carries, module names no other
    bundle owns and none in the place of the target kernel's own, signers the bundle's
    table allows. ``names`` is filled with the name each module file registers."""
    reasons = firmware_problems(
        [f.file for f in manifest.firmware],
        [name for v in modules if v.ok for name in v.firmware],
        bundle=manifest.bundle,
        policy=policy,
        host_file=host_firmware(layout, manifest.kernel),
        suffixes=target.firmware_suffixes,
        carried=owners.firmware,
    )
    pairs = zip(manifest.modules, modules, strict=True)
    registered = [(m.file, v.name or m.name) for m, v in pairs]
    if names is not None:
        names.update(registered)
    verified = [pair for pair, v in zip(registered, modules, strict=True) if v.ok]
    reasons += claimed_modules(verified, owners.modules, bundle=manifest.bundle)
    reasons += name_problems(
        registered,
        bundle=manifest.bundle,
        policy=policy,
        in_tree=host_modules(layout, manifest.kernel),
        builtin=target.builtin,
    )
    reasons += signer_problems(
        [(m.file, v.key_id) for m, v in zip(manifest.modules, modules, strict=True) if v.ok],
        bundle=manifest.bundle,
        policy=policy,
        trust=trust,
    )
    return reasons


def host_modules(layout: Layout, release: str) -> Callable[[str], str | None]:
    """Where kernel ``release``'s tree has its in-tree module of a name, as the host names it
    (``/lib/modules/<release>/kernel/lib/crc8.ko``), or None."""
    tree = modules_dir(layout, release)
    found = in_tree_modules(tree)

    def path(name: str) -> str | None:
        at = found.get(name)
        return None if at is None else "/" + (tree / at).relative_to(layout.root).as_posix()

    return path


def host_firmware(layout: Layout, release: str) -> Callable[[str], str | None]:
    """Which host file provides a firmware name for kernel ``release``: the first of its
    loader's directories holding it (a dangling link provides nothing), as the host names
    it (``/lib/firmware/...``), or None."""
    dirs = layout.firmware_dirs(release)

    def provider(name: str) -> str | None:
        for directory in dirs:
            if (directory / name).exists():
                return "/" + (directory / name).relative_to(layout.root).as_posix()
        return None

    return provider


def preflight(
    layout: Layout,
    keyring: Keyring,
    manifest: Manifest,
    verdicts: list[Verdict],
    target: Target,
    trust: TrustStore | None = None,
) -> list[str]:
    """What the target kernel will refuse, when it enforces. The running kernel is asked
    as it asks (``.secondary_trusted_keys``, then ``.platform`` on ENOKEY when built
    with it, then the module's hash against ``.blacklist``); a signer it does not trust is
    named with what makes it trusted (:func:`untrusted_signer`). An installed kernel that
    is not running trusts only the keys every kernel on the host shares and its own image's
    (:func:`~service.verify.signature.nextkeys.next_refusals`); ``.blacklist`` is dbx's."""
    signers = {v.key_id: v.signer for v in verdicts if v.key_id}
    running = RunningHost.read(layout).need_release()
    if manifest.kernel != running:
        why = next_enforcing(layout, target)
        if why is None:
            return []
        reasons = next_refusals(why, layout, keyring, target, signers, trust, running=running)
    else:
        why = enforcing(layout)
        if why is None:
            return []
        platform = target.rules.platform_keyring
        reasons = [
            untrusted_signer(why, k, signers[k], trust)
            for k in signers
            if not keyring.trusts(k, platform=platform)
        ]
    checks_hash = target.rules.hash_denylist
    for v in verdicts:
        digest = v.image_sha256 or v.sha256
        if digest and keyring.blacklisted(digest):
            reasons.append(
                f"{v.file}: EKEYREJECTED: module hash {digest} is in .blacklist"
                if checks_hash
                else f"{v.file}: EKEYREJECTED (policy): module hash {digest} is in .blacklist "
                "(the firmware's dbx); the target kernel no longer checks module hashes "
                "(Debian dropped it in 6.17) and would load it"
            )
    return reasons


def untrusted_signer(why: str, key_id: str, signer: str | None, trust: TrustStore | None) -> str:
    """The refusal of a signer the running kernel does not trust: its key id, its name, and
    the remedy hosts use (enroll the certificate modstage trusts it by as a MOK)."""
    key = None if trust is None else trust.find(bytes.fromhex(key_id))
    name = f" ({signer})" if signer else ""
    certificate = key.source if key is not None else "<its certificate>"
    return (
        f"EKEYREJECTED: the running kernel ({why}) does not trust signing key {key_id}{name}: "
        f"enroll it as a MOK: mokutil --import {certificate}, then reboot and confirm in "
        "MokManager (or add it to the UEFI db)"
    )

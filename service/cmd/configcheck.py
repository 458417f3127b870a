"""``modstage config check``: validate ``config.toml``, the trusted certificates, and
whether the reboot backend can reboot this host (kexec under lockdown needs a signed image).

Exit 0 when both are usable, 1 when either has a problem (each one named). What is unsafe
about the trust directory itself (a private key in it, a world-writable file or directory)
is a warning: the certificates still load.

It also shows the policy that applies to each bundle (:func:`bundle_policies`): every bundle
a ``[bundles.<name>]`` table or ``allowed_bundles`` names, and ``*`` for any other name when
``allowed_bundles`` is empty. A ``signers`` entry that names no trusted certificate is a
problem: no module of that bundle could be signed by it.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any, TextIO

from service.cmd.host import Host
from service.config import BundlePolicy, Config
from service.errors import ConfigError, TrustError
from service.intake.bundlerules import named_by
from service.layout import Layout
from service.rebooting.backends import BACKENDS
from service.rebooting.request import next_release
from service.verify.signature.trust import TrustedKey, TrustStore

ANY = "*"  # the bundle name config check shows the defaults under


def check(layout: Layout) -> dict[str, Any]:
    """Every problem of the host's config and trust directory, and what would apply."""
    host = Host(layout, strict_trust=True)
    problems: list[str] = []
    config: Config | None = None
    try:
        config = host.config
    except ConfigError as exc:
        problems += [f"{exc.path}: {p}" for p in exc.problems]
    if config is not None:
        check = BACKENDS[config.reboot.backend].check
        release = next_release(layout, config.kernel.next) if check is not None else ""
        if check is not None and (why := check(layout, release)):
            problems.append(f"reboot.backend = {config.reboot.backend!r}: {why}")
    certificates: list[dict[str, str]] = []
    trust: TrustStore | None = None
    try:
        trust = host.trust
        certificates = [certificate(k) for k in trust.keys]
        if not certificates:
            problems.append(f"{layout.trusted}: no trusted certificate: every module is refused")
    except TrustError as exc:
        problems.append(str(exc))
    bundles: dict[str, dict[str, Any]] = {}
    if config is not None:
        unmatched: list[str] = []
        bundles = bundle_policies(config, trust, unmatched)
        problems += [f"{layout.config}: {p}" for p in unmatched]
    from service.status.trustdir import trust_dir_problems

    warnings = trust_dir_problems(layout.trusted)
    return {
        "ok": not problems,
        "warnings": warnings,
        "config": {"path": str(layout.config), "exists": layout.config.exists()},
        "trusted": {"path": str(layout.trusted), "certificates": certificates},
        "backend": config.reboot.backend if config else None,
        "bundles": bundles,
        "problems": problems,
    }


def certificate(key: TrustedKey) -> dict[str, str]:
    """A trusted certificate as config check shows it: its file, subject and key identifier
    (the subjectKeyIdentifier, else the serial and issuer id), which ``signers`` may name."""
    return {"file": key.source, "subject": key.subject, "key_identifier": key.key_ids[-1].hex()}


def bundle_policies(
    config: Config, trust: TrustStore | None, problems: list[str]
) -> dict[str, dict[str, Any]]:
    """The effective ``[bundles.<name>]`` policy of each bundle the config names (``*``: any
    other, when ``allowed_bundles`` is empty), with the trusted certificates ``signers``
    allows (every one when it is empty; not resolved when the trust directory failed). A
    ``signers`` entry no certificate matches is added to ``problems``."""
    names = sorted({n for n, _ in config.bundles} | set(config.allowed_bundles))
    if not config.allowed_bundles:
        names.append(ANY)
    out = {}
    for name in names:
        policy = BundlePolicy() if name == ANY else config.bundle_policy(name)
        allowed: list[dict[str, str]] | None = None
        if trust is not None:
            keys = list(trust.keys) if not policy.signers else []
            for entry in policy.signers:
                found = named_by(entry, trust)
                if not found:
                    problems.append(
                        f"bundles.{name}.signers: {entry!r} names no certificate in trusted.d "
                        "(by file name or key identifier): it allows no signer"
                    )
                keys += [k for k in found if k not in keys]
            allowed = [certificate(k) for k in keys]
        out[name] = {
            "signers": list(policy.signers),
            "signed_by": allowed,
            "modules": list(policy.modules),
            "shadow_in_tree": list(policy.shadow_in_tree),
            "min_version": policy.min_version,
            "params": {"allow": list(policy.params), "deny": list(config.forbidden_params)},
            "firmware": list(policy.firmware),
            "firmware_override": list(policy.firmware_override),
        }
    return out


def policy_lines(name: str, policy: dict[str, Any]) -> list[str]:
    """A bundle's effective policy as ``config check`` prints it, one line a rule, each
    empty rule said in words (``any name``, ``none``)."""

    def listed(values: list[str], empty: str) -> str:
        return ", ".join(values) if values else empty

    signed_by = policy["signed_by"]
    if signed_by is None:
        signers = listed(policy["signers"], "any trusted certificate")
    elif policy["signers"] or signed_by:
        signers = (
            ", ".join(
                f"{Path(c['file']).name} ({c['subject']}, key identifier {c['key_identifier']})"
                for c in signed_by
            )
            or "none: every module is refused"
        )
    else:
        signers = "any trusted certificate (none is trusted)"
    allow = policy["params"]["allow"]
    params = f"only {', '.join(allow)}" if allow else "any"
    if policy["params"]["deny"]:
        params += f"; never {', '.join(policy['params']['deny'])} (forbidden_params)"
    firmware = "what its modules declare" + "".join(f", {g}" for g in policy["firmware"])
    shown = "any other bundle" if name == ANY else f"bundle {name}"
    return [
        f"{shown}: signers: {signers}",
        f"{shown}: modules: {listed(policy['modules'], 'any name')}",
        f"{shown}: shadow_in_tree: "
        + listed(policy["shadow_in_tree"], "none (no module named like the target kernel's own)"),
        f"{shown}: min_version: {policy['min_version'] or 'none'}",
        f"{shown}: params: {params}",
        f"{shown}: firmware: {firmware}; firmware_override: "
        + listed(policy["firmware_override"], "none (no host firmware file)"),
    ]


def run(args: argparse.Namespace, out: TextIO) -> int:
    """Print the check; exit 1 on any problem."""
    doc = check(Layout(args.root))
    if args.json:
        print(json.dumps(doc, indent=2, sort_keys=True), file=out)
    else:
        where = doc["config"]["path"] + ("" if doc["config"]["exists"] else " (absent: defaults)")
        print(f"config: {where}", file=out)
        for c in doc["trusted"]["certificates"]:
            ident = c["key_identifier"]
            print(f"trusted: {c['subject']} ({c['file']}, key identifier {ident})", file=out)
        for name, policy in doc["bundles"].items():
            for line in policy_lines(name, policy):
                print(line, file=out)
        for w in doc["warnings"]:
            print(f"warning: {w}", file=out)
        for p in doc["problems"]:
            print(f"problem: {p}", file=out)
        print("ok" if doc["ok"] else f"{len(doc['problems'])} problem(s)", file=out)
    return 0 if doc["ok"] else 1

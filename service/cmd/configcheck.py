"""``modstage config check``: validate ``config.toml``, the trusted certificates, and
whether the reboot backend can reboot this host (kexec under lockdown needs a signed image).

Exit 0 when both are usable, 1 when either has a problem (each one named). What is unsafe
about the trust directory itself (a private key in it, a world-writable file or directory)
is a warning: the certificates still load.
"""

from __future__ import annotations

import argparse
import json
from typing import Any, TextIO

from service.backends import BACKENDS
from service.cmd.host import Host
from service.config import Config
from service.errors import ConfigError, TrustError
from service.layout import Layout
from service.reboot import next_release


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
    try:
        trust = host.trust
        certificates = [{"file": k.source, "subject": k.subject} for k in trust.keys]
        if not certificates:
            problems.append(f"{layout.trusted}: no trusted certificate: every module is refused")
    except TrustError as exc:
        problems.append(str(exc))
    from service.status.trustdir import trust_dir_problems

    warnings = trust_dir_problems(layout.trusted)
    return {
        "ok": not problems,
        "warnings": warnings,
        "config": {"path": str(layout.config), "exists": layout.config.exists()},
        "trusted": {"path": str(layout.trusted), "certificates": certificates},
        "backend": config.reboot.backend if config else None,
        "problems": problems,
    }


def run(args: argparse.Namespace, out: TextIO) -> int:
    """Print the check; exit 1 on any problem."""
    doc = check(Layout(args.root))
    if args.json:
        print(json.dumps(doc, indent=2, sort_keys=True), file=out)
    else:
        where = doc["config"]["path"] + ("" if doc["config"]["exists"] else " (absent: defaults)")
        print(f"config: {where}", file=out)
        for c in doc["trusted"]["certificates"]:
            print(f"trusted: {c['subject']} ({c['file']})", file=out)
        for w in doc["warnings"]:
            print(f"warning: {w}", file=out)
        for p in doc["problems"]:
            print(f"problem: {p}", file=out)
        print("ok" if doc["ok"] else f"{len(doc['problems'])} problem(s)", file=out)
    return 0 if doc["ok"] else 1

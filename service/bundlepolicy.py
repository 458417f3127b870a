"""``[bundles.<name>]`` of ``config.toml``: what the host allows one bundle's drops beyond
the defaults (``docs/config.md``), read as every record is (:mod:`stager.schema.record`).

Every value but ``min_version`` (a version, ordered as Debian orders versions) and
``signers`` (trusted certificates, each by its key identifier in hex or its file name in
``trusted.d``: :func:`signer_problem`) is a list of shell-style globs (``fnmatch``, case
matters). ``firmware`` and ``firmware_override`` are
over a firmware file's name below ``firmware/`` (``*`` also matches ``/``;
:mod:`service.intake.firmware_names`); ``shadow_in_tree`` and ``modules`` are over module names
and ``params`` over module parameter names, ``-`` and ``_`` alike, as the kernel compares
both (:func:`name_matches`; :mod:`service.intake.bundlerules`).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from fnmatch import fnmatchcase
from typing import Any

from stager.schema.manifest import token_problem
from stager.schema.paths import bundle_problem
from stager.schema.record import RecordError, kind, load, spec


def _globs(patterns: tuple[str, ...]) -> str | None:
    return "'' is an empty glob" if "" in patterns else None


_GLOBS = spec(check=_globs)

# the certificate files trusted.d holds (service.verify.signature.trust.SUFFIXES)
CERTIFICATE_SUFFIXES = (".pem", ".der", ".crt", ".cer")


def key_identifier(entry: str) -> str | None:
    """A ``signers`` entry as a key identifier's lower-case hex (``AB:CD:…`` as openssl
    prints it, ``abcd…`` as ``modstage verify --json`` does), or None when it is not one."""
    digits = entry.replace(":", "").lower()
    if not digits or len(digits) % 2 or any(c not in "0123456789abcdef" for c in digits):
        return None
    return digits


def signer_problem(entry: str) -> str | None:
    """Why ``entry`` names no trusted certificate: it is neither a key identifier nor the
    name of a certificate file (no ``/``, one of trusted.d's suffixes)."""
    if key_identifier(entry) is not None:
        return None
    if "/" not in entry and entry.lower().endswith(CERTIFICATE_SUFFIXES):
        return None
    return (
        f"{entry!r} is neither a key identifier (hex) nor a certificate file name in "
        f"trusted.d ({', '.join('*' + s for s in CERTIFICATE_SUFFIXES)})"
    )


def _signers(entries: tuple[str, ...]) -> str | None:
    return next(filter(None, map(signer_problem, entries)), None)


@dataclass(frozen=True)
class BundlePolicy:
    """``[bundles.<name>]``: what the host allows one bundle beyond the defaults (a drop's
    firmware is what its own modules declare, its modules are none of the target kernel's)."""

    # firmware names it may ship though no module of it declares them
    firmware: tuple[str, ...] = field(default=(), metadata=_GLOBS)
    # firmware names it may shadow from the host's firmware directories
    firmware_override: tuple[str, ...] = field(default=(), metadata=_GLOBS)
    # module names of the target kernel's own (its tree or modules.builtin) it may take
    shadow_in_tree: tuple[str, ...] = field(default=(), metadata=_GLOBS)
    # the only module names its drops may carry; empty: any
    modules: tuple[str, ...] = field(default=(), metadata=_GLOBS)
    # the only module parameter names its drops may set; empty: any (but forbidden_params)
    params: tuple[str, ...] = field(default=(), metadata=_GLOBS)
    # the trusted certificates that may sign its modules; empty: any trusted one
    signers: tuple[str, ...] = field(default=(), metadata=spec(check=_signers))
    # the lowest manifest version a drop may have (the admin's rollback may go below it)
    min_version: str | None = field(default=None, metadata=spec(check=token_problem))


def name_matches(globs: Iterable[str], name: str) -> bool:
    """Whether a module or parameter ``name`` matches one of ``globs``, ``-`` and ``_``
    alike (the kernel compares both kinds of name so): the name with ``_`` for ``-``
    against each glob as written and with ``_`` for ``-`` (a ``[a-z]`` range keeps its
    meaning in the first)."""
    name = name.replace("-", "_")
    return any(fnmatchcase(name, g) or fnmatchcase(name, g.replace("-", "_")) for g in globs)


def load_bundles(value: Any, at: str, problems: list[str]) -> tuple[tuple[str, BundlePolicy], ...]:
    """``[bundles]``: a :class:`BundlePolicy` per bundle name, sorted by name; every problem
    of every table is added to ``problems``."""
    if not isinstance(value, dict):
        problems.append(f"{at}: must be a table of bundle tables, not {kind(value)}")
        return ()
    out = []
    for bundle, table in sorted(value.items()):
        where = f"{at}.{bundle}"
        if bundle_problem(bundle) is not None:
            problems.append(f"{where}: {bundle!r} is not a bundle name (no drop can use it)")
        try:
            out.append((bundle, load(BundlePolicy, table, where)))
        except RecordError as exc:
            problems += exc.problems
    return tuple(out)

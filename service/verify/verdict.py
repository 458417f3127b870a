"""Verify a module exactly as the kernel will load it: the capability intake and boot call.

:func:`verify_module` runs the kernel's checks (:mod:`service.verify.checks`) over an
open file; they are reported in the kernel's order (signature, ELF and ``.modinfo``,
vermagic), each as a reason naming the rule and errno. Hostile content never raises: it
becomes a :class:`Verdict` with ``ok=False``. :func:`verify_files` verifies a drop's
files in parallel, as far as :mod:`service.verify.compressed.budget` allows, and links its modules
in load order; :func:`verify_modules` does the same for module files named together.
"""

from __future__ import annotations

import errno
import hashlib
import os
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, replace
from functools import partial
from pathlib import Path
from typing import Any, BinaryIO

from service.beneath import open_regular
from service.errors import ModuleRejected, Refusal
from service.verify.checks import Facts, check, stream
from service.verify.compressed.budget import DropBudget, drop_budget, run_all
from service.verify.compressed.decompress import MAX_DECOMPRESSED
from service.verify.linking import Linkage
from service.verify.loadrules import finish
from service.verify.modfile.symtab import Export
from service.verify.signature.trust import TrustStore
from service.verify.targetkernel.kernel import Target
from stager.schema.failures import ManifestError
from stager.schema.manifest import MAX_MANIFEST_BYTES, Manifest
from stager.schema.paths import module_name


@dataclass(frozen=True)
class Verdict:
    """modstage's verdict on one file, which must equal the kernel's at load time."""

    file: str
    ok: bool
    refusal: Refusal | None = None  # why not ok: the errno, the words, whether a policy
    signer: str | None = None
    hash: str | None = None
    name: str | None = None  # the name the kernel registers (struct module's)
    vermagic: str | None = None
    sha256: str | None = None  # of the file as stored (compressed, if it is)
    srcversion: str | None = None
    depends: tuple[str, ...] = ()
    firmware: tuple[str, ...] = ()
    key_id: str | None = None  # hex of the kernel's key id ("ex:" id) of the signer
    compression: str | None = None  # "xz", "zst", "gz" by content, None for a plain ELF
    image_sha256: str | None = None  # of the decompressed module (what the kernel hashes)
    pci: tuple[str, ...] = ()  # its ``alias=pci:...`` patterns: the devices it is for
    notes: tuple[str, ...] = ()  # target facts that were missing, and what was assumed
    bundle: tuple[str, ...] = ()  # a module's: the files judged with it, in load order

    @classmethod
    def refused(cls, file: str, errno: str, message: str, **fields: Any) -> Verdict:
        """A refusal by a check of the kernel's (not a policy)."""
        return cls(file, False, Refusal(errno, message), **fields)

    @property
    def reason(self) -> str | None:
        """The refusal as text (``"ENOEXEC: ..."``, ``"EINVAL (policy): ..."``), or None."""
        return None if self.refusal is None else str(self.refusal)

    @property
    def errno(self) -> str | None:
        """The errno finit_module returns on the target with signature enforcement."""
        return None if self.refusal is None else self.refusal.enforced

    @property
    def policy(self) -> bool:
        """Refused by a modstage policy, where the kernel itself would load the module."""
        return self.refusal is not None and self.refusal.policy

    def to_json(self) -> dict[str, Any]:
        """A JSON-ready dict of every field, with ``reason``, ``errno`` and ``policy``."""
        out = asdict(self)
        del out["refusal"]
        out["depends"], out["firmware"] = list(self.depends), list(self.firmware)
        out["notes"], out["pci"] = list(self.notes), list(self.pci)
        out["bundle"] = list(self.bundle)
        out["reason"], out["errno"], out["policy"] = self.reason, self.errno, self.policy
        return out


def _verdict(facts: Facts) -> Verdict:
    """The first kernel problem is the refusal; a policy problem only when the kernel
    itself would accept the module."""
    kernel = [p for p in facts.problems if not p.policy]
    refusal = (kernel or facts.problems)[0] if facts.problems else None
    return Verdict(facts.display, refusal is None, refusal, **facts.fields)


def as_target(kernel: str | Target) -> Target:
    """A :class:`Target` from a release or full vermagic string (nothing read), or as is."""
    return kernel if isinstance(kernel, Target) else Target.from_spec(kernel)


def verify_module(
    f: BinaryIO,
    *,
    display: str,
    trust: TrustStore,
    kernel: str | Target,
    max_decompressed: int = MAX_DECOMPRESSED,
) -> Verdict:
    """Verify the module open in ``f`` (seekable, binary) for the target ``kernel``.

    ``kernel`` is a :class:`Target` (see :meth:`Target.from_layout`), or a release /
    full vermagic string with no configuration known. Never raises for bad content:
    every problem is a ``Verdict(ok=False, reason=...)``.
    """
    target = as_target(kernel)
    facts, linkage = _verify(f, display, trust, target, max_decompressed, drop_budget())
    return _finished(facts, linkage, target, {})


def _verify(
    f: BinaryIO, display: str, trust: TrustStore, target: Target, cap: int, drop: DropBudget
) -> tuple[Facts, Linkage | None]:
    """Every check up to the imports the target does not export (see :func:`_finished`)."""
    facts = Facts(display)
    linkage = None
    try:
        linkage = check(f, facts, trust, target, cap, drop)
    except ModuleRejected as exc:
        facts.problems.append(exc.refusal)
    except OSError as exc:
        facts.problems.append(Refusal("EIO", f"cannot read: {exc.strerror or exc}"))
    return facts, linkage


def _finished(
    facts: Facts,
    linkage: Linkage | None,
    target: Target,
    bundle: Mapping[str, Export],
    *,
    open_ended: bool = False,
) -> Verdict:
    """The verdict once ``bundle`` (exports of the modules loaded before) resolved the rest;
    ``open_ended``: modules not known here load before, so what is left is the kernel's."""
    if linkage is not None:
        try:
            finish(linkage, target, bundle, open_ended=open_ended)
        except ModuleRejected as exc:
            facts.problems.append(exc.refusal)
    facts.fields["notes"] = target.notes()
    return _verdict(facts)


def _failed(display: str, exc: OSError) -> Verdict:
    code = errno.errorcode.get(exc.errno or 0, "EIO")
    return Verdict.refused(display, code, f"cannot open: {exc.strerror or exc}")


def _module_at(
    root: Path,
    relative: str,
    display: str,
    trust: TrustStore,
    target: Target,
    follow: bool,
    drop: DropBudget,
) -> tuple[Facts, Linkage | None] | Verdict:
    try:
        f = open_regular(root, relative, follow=follow)
    except OSError as exc:
        return _failed(display, exc)
    with f:
        return _verify(f, display, trust, target, MAX_DECOMPRESSED, drop)


def verify_path(path: Path, *, trust: TrustStore, kernel: str | Target) -> Verdict:
    """Verify one module file (symlinks followed: the path comes from the admin)."""
    target = as_target(kernel)
    done = _module_at(path.parent, path.name, str(path), trust, target, True, drop_budget())
    return done if isinstance(done, Verdict) else _finished(*done, target, {})


def _linked(
    done: list[tuple[Facts, Linkage | None] | Verdict],
    names: list[str],
    target: Target,
    before: Mapping[str, Export] | None,
) -> list[Verdict]:
    """Module verdicts in load order, each module's imports resolved by the target and by
    the exports of the modules before it (as the kernel will see them)."""
    bundle: dict[str, Export] = dict(before or {})
    out = []
    for i, (item, name) in enumerate(zip(done, names, strict=True)):
        if isinstance(item, Verdict):
            out.append(item)
            continue
        verdict = _finished(*item, target, bundle, open_ended=before is None)
        linkage = item[1]
        if linkage is not None:
            out.append(_exported_later(verdict, linkage, done[i + 1 :]))
            bundle.update({n: e._replace(owner=name) for n, e in linkage.exports.items()})
        else:
            out.append(verdict)
    return out


def _exported_later(
    verdict: Verdict, linkage: Linkage, later: list[tuple[Facts, Linkage | None] | Verdict]
) -> Verdict:
    """``verdict``, its unknown symbol's reason naming the bundle's file that exports it
    but loads after it (the order is then the thing to fix)."""
    refusal = verdict.refusal
    if refusal is None or refusal.errno != "ENOENT":
        return verdict
    wanted = (i.name for i in linkage.unresolved)
    symbol = next((n for n in wanted if refusal.message.startswith(f"Unknown symbol {n} (no ")), "")
    for item in later:
        if not symbol or isinstance(item, Verdict) or item[1] is None:
            continue
        if symbol in item[1].exports:
            why = f"{refusal.message}; {item[0].display} exports it but loads after it"
            return replace(verdict, refusal=refusal._replace(message=why))
    return verdict


def _firmware_at(root: Path, relative: str, display: str, expected: str) -> Verdict:
    try:
        f = open_regular(root, relative, follow=False)
    except OSError as exc:
        return _failed(display, exc)
    whole = hashlib.sha256()
    try:
        with f:
            stream(f, os.fstat(f.fileno()).st_size, 0, set(), whole)
    except (OSError, ModuleRejected) as exc:
        why = exc.reason if isinstance(exc, ModuleRejected) else exc.strerror or str(exc)
        return Verdict.refused(display, "EIO", f"cannot read: {why}")
    digest = whole.hexdigest()
    if digest != expected:
        return Verdict(display, False, _mismatch(digest, expected), sha256=digest)
    return Verdict(display, True, sha256=digest)


def _mismatch(actual: str, expected: str) -> Refusal:
    return Refusal("EBADMSG", f"sha256 {actual} is not the manifest's {expected}")


def verify_drop(drop: Path, *, trust: TrustStore, kernel: str | Target) -> list[Verdict]:
    """Verify a drop directory: every module and firmware file against its manifest entry.

    Files are opened beneath ``drop`` without following symlinks. A manifest that cannot
    be read or parsed, or that targets another kernel, yields a rejected verdict for
    ``manifest.toml``; a digest that differs from the manifest's is the reason for its file.
    """
    display = str(drop / "manifest.toml")
    try:
        with open_regular(drop, "manifest.toml", follow=False) as f:
            manifest = Manifest.from_toml(f.read(MAX_MANIFEST_BYTES + 1), display)
    except OSError as exc:
        return [_failed(display, exc)]
    except ManifestError as exc:
        return [Verdict.refused(display, "EINVAL", str(exc))]
    verdicts = verify_files(drop, manifest, trust=trust, kernel=kernel)
    release = as_target(kernel).release
    if manifest.kernel != release:
        why = f"manifest is for kernel {manifest.kernel}, the target is {release}"
        verdicts.insert(0, Verdict.refused(display, "EINVAL", why))
    return verdicts


def verify_files(
    root: Path,
    manifest: Manifest,
    *,
    trust: TrustStore,
    kernel: str | Target,
    shown: Path | None = None,
    before: Mapping[str, Export] | None = {},
) -> list[Verdict]:
    """Verify the files ``manifest`` names beneath ``root`` (modules, then firmware).

    Verdicts name files under ``shown`` (default ``root``): intake verifies its store
    copy but reports the paths of the drop the container wrote. ``before``: the exports
    of modules loaded before this bundle's (the bundles it loads after), None when they
    are not known (imports neither the target nor the bundle exports are then not judged).
    """
    at = shown or root
    target = as_target(kernel)
    drop = drop_budget()
    jobs: list[Callable[[], tuple[Facts, Linkage | None] | Verdict]] = [
        partial(_module_at, root, m.file, str(at / m.file), trust, target, False, drop)
        for m in manifest.modules
    ]
    jobs += [
        partial(_firmware_at, root, fw.file, str(at / fw.file), fw.sha256)
        for fw in manifest.firmware
    ]
    done = run_all(jobs)
    count = len(manifest.modules)
    names = [module_name(m.file) for m in manifest.modules]
    verdicts = _linked(done[:count], names, target, before)
    verdicts += [v for v in done[count:] if isinstance(v, Verdict)]
    files = tuple(str(at / m.file) for m in manifest.modules)
    for i, entry in enumerate(manifest.modules):
        verdicts[i] = replace(verdicts[i], bundle=files)
        actual = verdicts[i].sha256
        if actual is not None and actual != entry.sha256:
            verdicts[i] = replace(verdicts[i], ok=False, refusal=_mismatch(actual, entry.sha256))
    return verdicts


def verify_modules(paths: list[Path], *, trust: TrustStore, kernel: str | Target) -> list[Verdict]:
    """Verify module files named together as one bundle loaded in the order given (no
    ``after``): each verified alone in parallel, then linked as :func:`verify_files` links
    a drop's modules, so a module may use what the files before it export (symlinks
    followed: the paths come from the admin)."""
    target = as_target(kernel)
    drop = drop_budget()
    jobs: list[Callable[[], tuple[Facts, Linkage | None] | Verdict]] = [
        partial(_module_at, p.parent, p.name, str(p), trust, target, True, drop) for p in paths
    ]
    names = [module_name(p.name) for p in paths]
    files = tuple(map(str, paths))
    return [replace(v, bundle=files) for v in _linked(run_all(jobs), names, target, {})]

"""Verify a module exactly as the kernel will load it: the capability intake and boot call.

:func:`verify_module` reads an open file once, in 1 MiB chunks: the same pass feeds the
signature digest (over the signed bytes) and the sha256 of the whole file (the
manifest's digest); when the signature uses sha256 the two share one hasher. Checks are
reported in the kernel's order (signature, ELF and ``.modinfo``, vermagic), each as a
reason naming the rule and errno. Hostile content never raises: it becomes a
:class:`Verdict` with ``ok=False``.
"""

from __future__ import annotations

import errno
import hashlib
import io
import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, replace
from functools import partial
from pathlib import Path
from typing import Any, BinaryIO, TypeVar, cast

from service.beneath import open_regular
from service.errors import ModuleRejected, Refusal
from service.verify.decompress import CHUNK, MAX_DECOMPRESSED, Hashed, compression, decompress_file
from service.verify.linking import Linkage
from service.verify.loadrules import finish, load_rules
from service.verify.modinfo import ModInfo
from service.verify.modsig import (
    Signed,
    check_signers,
    digest_policy,
    first_signer,
    read_at,
    read_signature,
)
from service.verify.symtab import Export
from service.verify.target import Target
from service.verify.trust import TrustStore
from stager.errors import ManifestError
from stager.manifest import MAX_MANIFEST_BYTES, Manifest
from stager.paths import module_name

T = TypeVar("T")

_MACHINES = {"x86_64": 62, "aarch64": 183, "ppc64le": 21, "s390x": 22, "riscv64": 243}


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
    notes: tuple[str, ...] = ()  # target facts that were missing, and what was assumed

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
        out["notes"] = list(self.notes)
        out["reason"], out["errno"], out["policy"] = self.reason, self.errno, self.policy
        return out


class _Facts:
    """What the checks learned so far; the first kernel problem becomes the refusal.

    A policy problem is the refusal only when the kernel itself would accept the module.
    """

    def __init__(self, display: str) -> None:
        self.display = display
        self.problems: list[Refusal] = []
        self.fields: dict[str, Any] = {}  # Verdict's fields, as they are learned

    def signed(self, signed: Signed) -> None:
        """Record who signed (as far as the check got)."""
        self.fields.update(signer=signed.signer, hash=signed.hash, key_id=signed.key_id)

    def verdict(self) -> Verdict:
        kernel = [p for p in self.problems if not p.policy]
        refusal = (kernel or self.problems)[0] if self.problems else None
        return Verdict(self.display, refusal is None, refusal, **self.fields)


def _stream(
    f: BinaryIO, size: int, signed_len: int, names: set[str], whole: Any
) -> dict[str, bytes]:
    """Read ``f`` once; digests of ``[0, signed_len)`` by name, ``whole`` fed everything."""
    shared = whole is not None and "sha256" in names
    hashers = {n: hashlib.new(n) for n in names if not (shared and n == "sha256")}
    digests: dict[str, bytes] = {}
    buf = memoryview(bytearray(CHUNK))
    f.seek(0)
    pos = 0
    if signed_len == 0:
        digests = {name: h.digest() for name, h in hashers.items()}
    while pos < size:
        n = cast(io.RawIOBase, f).readinto(buf[: min(CHUNK, size - pos)])
        if not n:
            raise ModuleRejected("EIO", "file shrank while being read")
        chunk = buf[:n]
        cut = max(0, min(n, signed_len - pos))
        if cut:
            for h in hashers.values():
                h.update(chunk[:cut])
            if whole is not None:
                whole.update(chunk[:cut])
            if pos + cut == signed_len:
                digests = {name: h.digest() for name, h in hashers.items()}
                if shared:
                    digests["sha256"] = whole.copy().digest()
        if whole is not None and cut < n:
            whole.update(chunk[cut:])
        pos += n
    return digests


def _check_elf(
    f: BinaryIO, size: int, facts: _Facts, trust: TrustStore, target: Target, whole: Any
) -> Linkage | None:
    """Signature, ELF, modinfo and vermagic of the (decompressed) module held in ``f``."""
    signed_len, msg = read_signature(f, size, facts.problems, target)
    names = {s.hash_algo or "" for s in msg.signers} if msg else set()
    names &= target.hashes & hashlib.algorithms_available
    digests = _stream(f, size, signed_len, names, whole)
    if whole is not None:
        facts.fields["sha256"] = whole.hexdigest()
    if msg is not None:
        facts.signed(first_signer(msg))
        try:
            signed = check_signers(msg, digests, trust, target)
        except ModuleRejected as exc:
            facts.problems.append(exc.refusal)
        else:
            facts.signed(signed)
            weak = digest_policy(signed)
            if weak is not None:
                facts.problems.append(weak)
    info = ModInfo.from_elf(
        lambda at, n: read_at(f, at, n),
        signed_len,
        _MACHINES.get(os.uname().machine),
        symbols=target.links,
    )
    facts.fields.update(
        name=info.module_name or info.name,
        vermagic=info.vermagic,
        srcversion=info.srcversion,
        depends=info.depends,
        firmware=info.firmware,
    )
    return load_rules(info, target)


def _check(
    f: BinaryIO, facts: _Facts, trust: TrustStore, target: Target, cap: int
) -> Linkage | None:
    size = f.seek(0, os.SEEK_END)
    whole = hashlib.sha256()
    kind = compression(read_at(f, 0, 6))
    if kind is None:
        return _check_elf(f, size, facts, trust, target, whole)
    facts.fields["compression"] = kind
    stored = Hashed()
    try:
        elf = decompress_file(f, kind, cap, stored)
    finally:
        facts.fields["sha256"] = stored.sha256.hexdigest()
    facts.fields["image_sha256"] = hashlib.sha256(elf).hexdigest()
    return _check_elf(io.BytesIO(elf), len(elf), facts, trust, target, None)


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
    facts, linkage = _verify(f, display, trust, target, max_decompressed)
    return _finished(facts, linkage, target, {})


def _verify(
    f: BinaryIO, display: str, trust: TrustStore, target: Target, cap: int
) -> tuple[_Facts, Linkage | None]:
    """Every check up to the imports the target does not export (see :func:`_finished`)."""
    facts = _Facts(display)
    linkage = None
    try:
        linkage = _check(f, facts, trust, target, cap)
    except ModuleRejected as exc:
        facts.problems.append(exc.refusal)
    except OSError as exc:
        facts.problems.append(Refusal("EIO", f"cannot read: {exc.strerror or exc}"))
    return facts, linkage


def _finished(
    facts: _Facts,
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
    return facts.verdict()


def _failed(display: str, exc: OSError) -> Verdict:
    code = errno.errorcode.get(exc.errno or 0, "EIO")
    return Verdict.refused(display, code, f"cannot open: {exc.strerror or exc}")


def _module_at(
    root: Path, relative: str, display: str, trust: TrustStore, target: Target, follow: bool
) -> tuple[_Facts, Linkage | None] | Verdict:
    try:
        f = open_regular(root, relative, follow=follow)
    except OSError as exc:
        return _failed(display, exc)
    with f:
        return _verify(f, display, trust, target, MAX_DECOMPRESSED)


def verify_path(path: Path, *, trust: TrustStore, kernel: str | Target) -> Verdict:
    """Verify one module file (symlinks followed: the path comes from the admin)."""
    target = as_target(kernel)
    done = _module_at(path.parent, path.name, str(path), trust, target, True)
    return done if isinstance(done, Verdict) else _finished(*done, target, {})


def _linked(
    done: list[tuple[_Facts, Linkage | None] | Verdict],
    names: list[str],
    target: Target,
    before: Mapping[str, Export] | None,
) -> list[Verdict]:
    """Module verdicts in load order, each module's imports resolved by the target and by
    the exports of the modules before it (as the kernel will see them)."""
    bundle: dict[str, Export] = dict(before or {})
    out = []
    for item, name in zip(done, names, strict=True):
        if isinstance(item, Verdict):
            out.append(item)
            continue
        out.append(_finished(*item, target, bundle, open_ended=before is None))
        linkage = item[1]
        if linkage is not None:
            bundle.update({n: e._replace(owner=name) for n, e in linkage.exports.items()})
    return out


def _firmware_at(root: Path, relative: str, display: str, expected: str) -> Verdict:
    try:
        f = open_regular(root, relative, follow=False)
    except OSError as exc:
        return _failed(display, exc)
    whole = hashlib.sha256()
    try:
        with f:
            _stream(f, os.fstat(f.fileno()).st_size, 0, set(), whole)
    except (OSError, ModuleRejected) as exc:
        why = exc.reason if isinstance(exc, ModuleRejected) else exc.strerror or str(exc)
        return Verdict.refused(display, "EIO", f"cannot read: {why}")
    digest = whole.hexdigest()
    if digest != expected:
        return Verdict(display, False, _mismatch(digest, expected), sha256=digest)
    return Verdict(display, True, sha256=digest)


def _mismatch(actual: str, expected: str) -> Refusal:
    return Refusal("EBADMSG", f"sha256 {actual} is not the manifest's {expected}")


def _run_all(jobs: Sequence[Callable[[], T]]) -> list[T]:
    """Run verification jobs on every core (hashlib releases the GIL), results in order."""
    if len(jobs) < 2:
        return [job() for job in jobs]
    from concurrent.futures import ThreadPoolExecutor  # several files only, not at boot

    with ThreadPoolExecutor(max_workers=min(len(jobs), os.cpu_count() or 2)) as pool:
        return list(pool.map(lambda job: job(), jobs))


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
    jobs: list[Callable[[], tuple[_Facts, Linkage | None] | Verdict]] = [
        partial(_module_at, root, m.file, str(at / m.file), trust, target, False)
        for m in manifest.modules
    ]
    jobs += [
        partial(_firmware_at, root, fw.file, str(at / fw.file), fw.sha256)
        for fw in manifest.firmware
    ]
    done = _run_all(jobs)
    count = len(manifest.modules)
    names = [module_name(m.file) for m in manifest.modules]
    verdicts = _linked(done[:count], names, target, before)
    verdicts += [v for v in done[count:] if isinstance(v, Verdict)]
    for i, entry in enumerate(manifest.modules):
        actual = verdicts[i].sha256
        if actual is not None and actual != entry.sha256:
            verdicts[i] = replace(verdicts[i], ok=False, refusal=_mismatch(actual, entry.sha256))
    return verdicts


def verify_paths(paths: list[Path], *, trust: TrustStore, kernel: str | Target) -> list[Verdict]:
    """Verdicts for module files and drop directories, in order; files verified in parallel."""
    files = [partial(verify_path, p, trust=trust, kernel=kernel) for p in paths if not p.is_dir()]
    done = iter(_run_all(files))
    out: list[Verdict] = []
    for p in paths:
        out += verify_drop(p, trust=trust, kernel=kernel) if p.is_dir() else [next(done)]
    return out

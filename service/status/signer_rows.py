"""Who signed each module of a bundle's active and pending generations, named as people and
the kernel name the key, whether a kernel keyring holds it, and what the kernel made of the
modules that are live.

The name is the kernel's description of the key, ``"<subject>: <SKID, else serial>"``
(:mod:`service.verify.signature.keyid`): from the certificate when modstage knows it (a
trusted certificate in ``trusted.d``, or a key /proc/keys ties to the signature), else from
the signature's own identifier. A live module of the active generation carries the kernel's
verdict from its taint (:mod:`service.host.taint`). :func:`signer_rows` gives one row per
module (``status --json``); :func:`signer_lines` groups them into one line per signer and
generation, which the plain and the rich view both print.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import replace
from pathlib import Path
from typing import Protocol

from service.bundles.state import BundleState
from service.errors import TrustError
from service.generations.store import Store
from service.host.running import RunningHost
from service.host.taint import UNSIGNED, kernel_taint, module_taint, unsigned_taint
from service.layout import Layout, modules_dir
from service.status.report import SignerLine, SignerRow
from service.verify.signature.asn1 import Asn1Error
from service.verify.signature.keyid import (
    SignerId,
    SignerName,
    matches,
    name_certificate,
    name_signature,
)
from service.verify.signature.keyring import (
    KernelKeyring,
    KeyDescription,
    enforcing,
    module_signer,
    name_in_keyring,
)
from service.verify.signature.trust import TrustStore
from service.verify.signature.x509 import Cert, parse_certificate
from service.verify.targetkernel.intree import in_tree_modules
from service.verify.targetkernel.rules import KernelRules
from stager.schema.manifest import ModuleEntry

VERIFIED, UNVERIFIED = "verified", "unverified"
#: How the views say :attr:`SignerRow.loaded`.
LOADED = {
    UNVERIFIED: "loaded unverified (kernel tainted)",
    VERIFIED: "loaded, verified by the kernel",
}


class Holder(Protocol):
    """The running kernel's keyrings as ``status`` asks them (:class:`KernelKeyring`)."""

    def where(self, key_id: str) -> str | None:
        """Which keyring holds key ``ex:<key_id>`` (None: none does)."""

    def visible(self) -> bool:
        """Whether this process sees the system keyrings at all."""

    def descriptions(self) -> tuple[KeyDescription, ...]:
        """The asymmetric keys /proc/keys describes."""


#: a sandbox's keyring note: its modules are for a kernel that is not the one running, whose
#: keyrings would say nothing of them (and a sandbox has no /proc/keys of its own)
NO_KEYRINGS = "keyrings not searched (a sandbox has none)"


class NoKeyrings:
    """A sandbox's keyrings (``--root`` other than ``/``): none to search."""

    def where(self, key_id: str) -> str | None:
        """None: no keyring holds anything."""
        return None

    def visible(self) -> bool:
        """False: there are none to see."""
        return False

    def descriptions(self) -> tuple[KeyDescription, ...]:
        """No keys."""
        return ()


def loaded_verdict(
    taint: str | None,
    *,
    live: bool,
    checks: bool,
    kernel_unsigned: bool | None,
    held: bool | None,
    enforced: bool | None,
) -> str | None:
    """The kernel's verdict on a live module's signature when it loaded it.

    ``taint`` is the module's own letters: ``E`` means it loaded without a trusted signature
    (:data:`UNVERIFIED`); without ``E``, on a kernel that ``checks`` signatures (it has
    ``sig_enforce``), the signature verified (:data:`VERIFIED`). When the module's letters
    cannot be read: :data:`UNVERIFIED` only if the kernel's mask has ``TAINT_UNSIGNED_MODULE``
    (``kernel_unsigned``), no keyring holds the signer (``held`` False) and the kernel does
    not enforce signatures (``enforced`` False); otherwise unknown (None).
    """
    if not live:
        return None
    if taint is not None:
        if UNSIGNED in taint:
            return UNVERIFIED
        return VERIFIED if checks else None
    if kernel_unsigned and held is False and enforced is False:
        return UNVERIFIED
    return None


class _Known:
    """The certificates that can name a signer, read once per ``status``."""

    def __init__(self, trusted: Path, keyring: Holder) -> None:
        self.trusted, self.keyring = trusted, keyring
        self._certs: list[tuple[Cert, str]] | None = None
        self._keys: tuple[KeyDescription, ...] | None = None

    def certs(self) -> list[tuple[Cert, str]]:
        """modstage's trusted certificates, parsed as the kernel parses them."""
        if self._certs is None:
            self._certs = []
            try:
                store = TrustStore.from_directory(self.trusted)
            except TrustError:
                return self._certs  # no trusted certificates to name anyone by
            for key in store.keys:
                try:
                    cert = parse_certificate(key.der, rules=KernelRules.newest())
                except Asn1Error:
                    continue
                self._certs.append((cert, key.source))
        return self._certs

    def keys(self) -> tuple[KeyDescription, ...]:
        """The kernel's asymmetric keys (none when /proc/keys cannot be read)."""
        if self._keys is None:
            try:
                self._keys = self.keyring.descriptions()
            except OSError:
                self._keys = ()
        return self._keys

    def name(self, sid: SignerId, *, held: bool) -> SignerName:
        """A trusted certificate's name for the key, else the kernel keyring's (only when a
        keyring holds it), else the signature's."""
        for cert, source in self.certs():
            if matches(cert, sid):
                return name_certificate(cert, source)
        found = name_in_keyring(self.keys(), sid) if held else None
        return found or name_signature(sid)


def _where(keyring: Holder, key_id: str) -> tuple[str | None, str | None]:
    """(the keyring holding the key, why that is unknown)."""
    if isinstance(keyring, NoKeyrings):
        return None, NO_KEYRINGS
    try:
        where = keyring.where(key_id)
        if where is None and not keyring.visible():
            return None, "the kernel's keyrings are not visible (run as root)"
    except OSError as exc:
        where = f" ({exc.filename})" if exc.filename else ""
        return None, f"cannot search the kernel's keyrings: {exc.strerror or exc}{where}"
    return where, None


class _Kernel:
    """What the running kernel says about signatures, read once per ``status``."""

    def __init__(self, layout: Layout) -> None:
        self.sys = layout.sys
        self.checks = layout.sig_enforce.exists()
        try:
            self.enforced: bool | None = enforcing(layout) is not None
        except OSError:
            self.enforced = None
        self.unsigned = unsigned_taint(kernel_taint(layout.tainted))


def _row(
    path: Path,
    entry: ModuleEntry,
    generation: str,
    version: str | None,
    *,
    live: bool,
    keyring: Holder,
    known: _Known,
    kernel: _Kernel,
) -> SignerRow:
    """One module's signer row."""
    try:
        sid = module_signer(path)
    except OSError as exc:
        why = f"cannot read {path}: {exc.strerror or exc}"  # names the file
        return SignerRow(generation, entry.file, None, None, why, version)
    where, note = (None, "unsigned") if sid is None else _where(keyring, sid.key_id.hex())
    name = None if sid is None else known.name(sid, held=where is not None)
    taint = module_taint(kernel.sys, entry.name) if live else None
    loaded = loaded_verdict(
        taint,
        live=live,
        checks=kernel.checks,
        kernel_unsigned=kernel.unsigned,
        held=None if note else where is not None,
        enforced=kernel.enforced,
    )
    return SignerRow(
        generation,
        entry.file,
        None if sid is None else sid.key_id.hex(),
        where,
        note,
        version,
        signer=None if name is None else name.name,
        issuer=None if name is None else name.issuer,
        serial=None if name is None else name.serial,
        skid=None if name is None else name.skid,
        certificate=None if name is None else name.source,
        taint=taint,
        loaded=loaded,
    )


def signer_rows(
    layout: Layout, b: BundleState | None, keyring: Holder | None = None
) -> tuple[SignerRow, ...]:
    """Each module of the active and pending generations: who signed it, the running
    kernel's keyring that holds the key, and for a live module of the active generation the
    kernel's verdict (read-only: the store, ``trusted.d``, /proc/keys, keyctl searches and
    the taint files). ``keyring`` defaults to the running kernel's, or in a sandbox to none:
    its kernel is not the running one, so the running kernel's keyrings are not searched."""
    if b is None:
        return ()
    store = Store(layout.store)
    ring: Holder = (
        NoKeyrings() if RunningHost.read(layout).sandboxed else KernelKeyring(layout.proc)
    )
    ring = keyring if keyring is not None else ring
    known, kernel = _Known(layout.trusted, ring), _Kernel(layout)
    recorded = {m.module for m in b.loaded}
    rows: list[SignerRow] = []
    trees: dict[str, dict[str, str]] = {}  # each kernel's in-tree modules, read once
    for generation in dict.fromkeys(g for g in (b.active, b.pending) if g):
        known_gen = b.generations.get(generation)
        version = known_gen.version if known_gen else None
        own = _in_tree(layout, known_gen.kernel, trees) if known_gen else {}
        try:
            entries = store.manifest(generation).modules
        except Exception as exc:  # a store damaged under status: say so, never crash status
            why = f"cannot read the manifest: {exc}"
            rows.append(SignerRow(generation, "", None, None, why, version))
            continue
        for entry in entries:
            live = (
                generation == b.active
                and entry.name in recorded
                and (layout.sys / "module" / entry.name).is_dir()
            )
            row = _row(
                store.path(generation) / entry.file,
                entry,
                generation,
                version,
                live=live,
                keyring=ring,
                known=known,
                kernel=kernel,
            )
            rows.append(replace(row, shadows=own.get(entry.name)))
    return tuple(rows)


def _in_tree(layout: Layout, release: str, trees: dict[str, dict[str, str]]) -> dict[str, str]:
    """``release``'s in-tree modules by name (:func:`in_tree_modules`), read once per
    status into ``trees``; none when its module tree is not installed."""
    if release not in trees:
        tree = modules_dir(layout, release)
        trees[release] = in_tree_modules(tree) if tree.is_dir() else {}
    return trees[release]


def shadow_lines(rows: Iterable[SignerRow], bundle: str) -> list[str]:
    """One line per module that takes the name of an in-tree module of its kernel."""
    return [
        f"{r.file} shadows the in-tree {r.shadows} of its kernel: while it is loaded, "
        f"the kernel's own module of that name cannot load ([bundles.{bundle}] "
        "shadow_in_tree lets a drop carry one)"
        for r in rows
        if r.shadows
    ]


def _trust(row: SignerRow) -> str:
    """Whether a kernel keyring holds the row's key, or why that is unknown."""
    if row.keyring:
        return f"trusted by .{row.keyring}"
    return row.note or "trusted by no keyring"


def _loaded(rows: list[SignerRow]) -> str | None:
    """The kernel's verdict on the group's live modules: once when every module of the
    group has the same one, else per module."""
    said = [(r.file, LOADED[r.loaded]) for r in rows if r.loaded in LOADED]
    if not said:
        return None
    if len(said) == len(rows) and len({v for _, v in said}) == 1:
        return said[0][1]
    return "; ".join(f"{file} {verdict}" for file, verdict in said)


def signer_lines(rows: Iterable[SignerRow]) -> tuple[SignerLine, ...]:
    """One line per signer and generation (the modules it signed listed on it), in the
    order the rows come: what both views print."""
    groups: dict[tuple[str, str | None, str], list[SignerRow]] = {}
    for r in rows:
        signer = r.signer or (f"key id {r.key_id}" if r.key_id else None)
        groups.setdefault((r.generation, signer, _trust(r)), []).append(r)
    return tuple(
        SignerLine(
            generation,
            members[0].version,
            signer,
            members[0].issuer,
            tuple(m.file for m in members if m.file),
            trust,
            _loaded(members),
        )
        for (generation, signer, trust), members in groups.items()
    )

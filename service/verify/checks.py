"""The kernel's checks of one module file, in its order, as facts for a verdict.

:func:`check` reads an open file once, in 1 MiB chunks: the same pass feeds the signature
digest (over the signed bytes) and the sha256 of the whole file (the manifest's digest);
when the signature uses sha256 the two share one hasher. A compressed module is
decompressed into an unnamed temporary file (in the drop's private directory, see
:func:`service.verify.compressed.budget.per_drop`) and checked from there: its image is
never held in memory, the decompressor's window waits for
:data:`~service.verify.compressed.budget.GATE`, and a size its header states over the cap
(or over what the drop has left) is refused before anything is decompressed.
"""

from __future__ import annotations

import hashlib
import io
import os
import tempfile
from typing import Any, BinaryIO, cast

from service.errors import ModuleRejected, Refusal
from service.verify.compressed.budget import GATE, DropBudget
from service.verify.compressed.decompress import (
    CHUNK,
    ZSTD_BURST,
    Hashed,
    compression,
    decompress_into,
)
from service.verify.compressed.stated import MAX_WINDOW, stated
from service.verify.linking import Linkage
from service.verify.loadrules import load_rules
from service.verify.modfile.modinfo import ModInfo
from service.verify.signature.modsig import (
    Signed,
    check_signers,
    digest_policy,
    first_signer,
    read_at,
    read_signature,
)
from service.verify.signature.trust import TrustStore
from service.verify.targetkernel.kernel import Target

_MACHINES = {"x86_64": 62, "aarch64": 183, "ppc64le": 21, "s390x": 22, "riscv64": 243}


class Facts:
    """What the checks learned so far: the problems found, and the verdict's fields."""

    def __init__(self, display: str) -> None:
        self.display = display
        self.problems: list[Refusal] = []
        self.fields: dict[str, Any] = {}  # Verdict's fields, as they are learned

    def signed(self, signed: Signed) -> None:
        """Record who signed (as far as the check got)."""
        self.fields.update(signer=signed.signer, hash=signed.hash, key_id=signed.key_id)


def stream(
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


def check_elf(
    f: BinaryIO, size: int, facts: Facts, trust: TrustStore, target: Target, whole: Any, key: str
) -> Linkage | None:
    """Signature, ELF, modinfo and vermagic of the (decompressed) module held in ``f``;
    ``whole``'s digest of all of ``f`` becomes the field ``key``."""
    signed_len, msg = read_signature(f, size, facts.problems, target)
    names = {s.hash_algo or "" for s in msg.signers} if msg else set()
    names &= target.rules.hashes & hashlib.algorithms_available
    digests = stream(f, size, signed_len, names, whole)
    facts.fields[key] = whole.hexdigest()
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
        pci=tuple(v for k, v in info.fields if k == "alias" and v.startswith("pci:")),
    )
    return load_rules(info, target)


def check(
    f: BinaryIO, facts: Facts, trust: TrustStore, target: Target, cap: int, drop: DropBudget
) -> Linkage | None:
    """Every check of the module open in ``f`` up to the imports (see ``verdict``)."""
    size = f.seek(0, os.SEEK_END)
    kind = compression(read_at(f, 0, 6))
    if kind is None:
        return check_elf(f, size, facts, trust, target, hashlib.sha256(), "sha256")
    facts.fields["compression"] = kind
    with tempfile.TemporaryFile(dir=drop.spill) as image:
        size = _decompress(f, kind, image, facts, cap, drop)
        return check_elf(image, size, facts, trust, target, hashlib.sha256(), "image_sha256")


def _decompress(
    f: BinaryIO, kind: str, image: BinaryIO, facts: Facts, cap: int, drop: DropBudget
) -> int:
    """The compressed module in ``f`` decompressed into ``image`` (its size): refused when
    its header states too much, or its stream makes too much (EFBIG)."""
    stored = Hashed()
    try:
        head = stated(f, kind)
        if head.size is not None and head.size > cap:
            raise ModuleRejected("EFBIG", f"decompressed module exceeds {cap} bytes")
        if head.size is not None and head.size > drop.left():
            raise ModuleRejected("EFBIG", drop.why())
        if head.window > MAX_WINDOW:
            why = f"its {kind} window of {head.window} bytes is over modstage's {MAX_WINDOW}"
            raise ModuleRejected("EFBIG", why)
    except ModuleRejected:
        f.seek(0)
        while data := f.read(CHUNK):  # the stored file's digest is known either way
            stored.sha256.update(data)
        facts.fields["sha256"] = stored.sha256.hexdigest()
        raise
    # held: the window; the compressed input read (and zlib's copy of what it left); the
    # output on its way to the file (zstd's: up to a burst past it)
    cost = head.window + 3 * CHUNK + (ZSTD_BURST if kind == "zst" else 0)
    try:
        with GATE.admitted(cost):
            return decompress_into(
                f, kind, image, cap=cap, hashed=stored, window=head.window, count=drop.add
            )
    finally:
        facts.fields["sha256"] = stored.sha256.hexdigest()

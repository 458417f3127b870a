"""kmod's `modinfo` as the reference for modstage's reading of in-tree modules.

For one module file, `disagreements(path)` runs `modinfo -0 -F <field>` (kmod: every value of
the field, NUL-terminated, in file order) for every field the module's `.modinfo` has, and
compares each with modstage's reading (`ModInfo.fields`, the kernel's `next_string` walk).
kmod merges two fields and makes up four, so those are compared in its shape: `parm` is
`name:description (type)` from `parm=` and `parmtype=` (`name: (type)` without a
description, `name:description` without a type), last-mentioned parameter first (kmod's
modinfo prepends each new name to its list) and, for a name described twice (6.12's
`pm80xx` describes `zoned` twice), the last description; `signer`, `sig_key` and `sig_hashalgo` come from the PKCS#7 signature
(the issuer's common name, the serial in colon-separated hex, the digest), compared with
modstage's key id split into issuer and serial and its signer's digest. The host's kmod
(Debian 12's, built with xz and zstd) reads every kernel's modules alike.

Used by tests/service/test_kernel_files.py (a fixed sample per kernel) and bench/modinfo
(every in-tree module).
"""

from __future__ import annotations

import subprocess
from pathlib import Path

from service.verify.compressed.decompress import compression, decompress
from service.verify.modfile.modinfo import ModInfo
from service.verify.signature.keyid import split_key_id
from service.verify.signature.pkcs7 import parse_message
from service.verify.signature.trailer import TAIL, parse_trailer
from service.verify.targetkernel.rules import KernelRules

MERGED = ("parm", "parmtype")  # kmod shows them as one `parm`
SUFFIXES = (".ko", ".ko.xz", ".ko.zst", ".ko.gz")


def kmod_field(path: Path, field: str) -> list[str]:
    """Every value kmod's `modinfo -0 -F field` prints for `path`."""
    done = subprocess.run(
        ["modinfo", "-0", "-F", field, str(path)], capture_output=True, check=False
    )
    if done.returncode != 0:
        raise RuntimeError(f"modinfo -F {field} {path}: {done.stderr.decode(errors='replace')}")
    return [v.decode("utf-8", "replace") for v in done.stdout.split(b"\0")[:-1]]


def _module_bytes(path: Path) -> bytes:
    with path.open("rb") as f:
        kind = compression(f.read(6))
        f.seek(0)
        return f.read() if kind is None else decompress(f.read, kind)


def params_as_kmod(fields: tuple[tuple[str, str], ...]) -> list[str]:
    """`parm=` and `parmtype=` merged as kmod's modinfo shows them."""
    order: list[str] = []
    described: dict[str, str] = {}
    typed: dict[str, str] = {}
    for key, value in fields:
        if key not in MERGED:
            continue
        name, _colon, rest = value.partition(":")
        if name not in order:
            order.append(name)
        (described if key == "parm" else typed)[name] = rest  # a repeated one: kmod keeps the last
    out = []
    for name in reversed(order):
        line = f"{name}:{described.get(name, '')}"
        if name in typed:
            line += f" ({typed[name]})"
        out.append(line)
    return out


def signature_as_kmod(data: bytes) -> dict[str, list[str]]:
    """`signer`, `sig_key` and `sig_hashalgo` as modstage reads them ({} when unsigned)."""
    try:
        trailer = parse_trailer(data[-TAIL:], len(data))
    except Exception:  # ModuleRejected: unsigned or no trailer: kmod prints nothing either
        return {}
    blob = data[trailer.signed_len : trailer.signed_len + trailer.sig_len]
    hashes = frozenset({"sha256", "sha384", "sha512"})
    msg = parse_message(blob, rules=KernelRules.newest(hashes))
    first = msg.signers[0]
    split = split_key_id(first.auth_id)
    if split is None:
        return {"sig_hashalgo": [first.hash_algo or ""]}
    serial, issuer = split
    size = max(1, (serial.bit_length() + 7) // 8)
    key = ":".join(f"{b:02X}" for b in serial.to_bytes(size, "big"))
    return {"signer": [issuer], "sig_key": [key], "sig_hashalgo": [first.hash_algo or ""]}


def disagreements(path: Path) -> list[str]:
    """Every field on which modstage's reading of `path` differs from kmod's modinfo."""
    data = _module_bytes(path)
    info = ModInfo.from_bytes(data)
    mine: dict[str, list[str]] = {}
    for key, value in info.fields:
        if key not in MERGED:
            mine.setdefault(key, []).append(value)
    if any(key in MERGED for key, _ in info.fields):
        mine["parm"] = params_as_kmod(info.fields)
    signature = signature_as_kmod(data)
    out = []
    for field, values in {**mine, **signature}.items():
        theirs = kmod_field(path, field)
        if field == "signer" and theirs and values[0].endswith(theirs[0]):
            continue  # the kernel renders "O: CN" where kmod prints the CN alone
        if theirs != values:
            out.append(f"{path}: {field}: kmod {theirs!r}, modstage {values!r}")
    return out


def in_tree(modules: Path) -> list[Path]:
    """Every in-tree module file under `modules`/kernel, sorted."""
    return sorted(p for p in (modules / "kernel").rglob("*") if p.name.endswith(SUFFIXES))

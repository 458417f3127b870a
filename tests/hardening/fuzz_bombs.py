"""Decompression bombs for the drop fuzzer (see fuzz_drops.py for the generators' shape).

Each generator plants one drop whose modules expand far past what the host allows: xz,
zstd and gzip streams of zeros whose header states the size (refused before
decompressing), states none (stopped by the stream's cap or the drop's budget), or lies
(a zstd frame header, a gzip ISIZE stating 4 KiB); a small module followed by a bomb
stream, frame or member; many small bombs in one drop; bombs beside the good module in
one drop. The fuzzer's own good drop of every round is the bundle next to them, which
must still be taken in within the usual time. Bombs are built once per process.
"""

from __future__ import annotations

import functools
import gzip
import hashlib
import lzma
import random
import struct
import zlib
from pathlib import Path

import tomli_w
import zstandard

from tests.hardening.fuzz_drops import Gen, M, World, _copy_template, _finish, _manifest, _name

MiB = 1 << 20
# The fuzzer's daemon allows a drop 16 MiB of decompressed modules (its config): a bomb
# costs the good drop beside it no more than that; the 512 MiB cap of one module and the
# default budget are the unit tests' (tests/service/test_decompress_bounds.py)
BIG = 48 * MiB  # past the drop's budget
SMALL = 6 * MiB  # under it: several pass it together
KINDS = ("xz", "zst", "gz")


def _zeros_chunks(size: int) -> list[bytes]:
    """``size`` zeros in pieces of at most 16 MiB (one piece shared)."""
    step = 16 * MiB
    return [bytes(step)] * (size // step) + [bytes(size % step)]


@functools.cache
def stated(kind: str, size: int) -> bytes:
    """``size`` zeros compressed as ``kind``, the size stated in its header or trailer."""
    if kind == "xz":
        c = lzma.LZMACompressor(format=lzma.FORMAT_XZ, preset=0)
        return b"".join(c.compress(z) for z in _zeros_chunks(size)) + c.flush()
    if kind == "zst":
        z = zstandard.ZstdCompressor(level=1).compressobj(size=size)
        return b"".join(z.compress(c) for c in _zeros_chunks(size)) + z.flush()
    g = zlib.compressobj(1, zlib.DEFLATED, 16 + zlib.MAX_WBITS)
    return b"".join(g.compress(c) for c in _zeros_chunks(size)) + g.flush()


@functools.cache
def unstated(size: int) -> bytes:
    """A zstd frame of ``size`` zeros from a streaming compressor: no content size."""
    c = zstandard.ZstdCompressor(level=1).compressobj()
    return b"".join(c.compress(z) for z in _zeros_chunks(size)) + c.flush()


@functools.cache
def lying(kind: str, size: int) -> bytes:
    """``size`` zeros whose stated size is 4 KiB: a zstd frame header, a gzip ISIZE."""
    if kind == "gz":
        return stated("gz", size)[:-4] + struct.pack("<I", 4096)
    frame = stated("zst", size)
    assert frame[4] >> 6 == 2 and not frame[4] & 0x20, "a 4-byte size after the window byte"
    return frame[:6] + struct.pack("<I", 4096) + frame[10:]


def _plant(rng: random.Random, w: World, blobs: list[bytes], keep_good: bool = False) -> None:
    """A copy of the template whose modules are ``blobs`` (the good one first if
    ``keep_good``), each listed with its true digest, so the bomb is the only reason."""
    tmp = _copy_template(rng, w)
    data = _manifest(w)
    entries = list(data["module"]) if keep_good else []  # type: ignore[call-overload]
    if not keep_good:
        (tmp / M).unlink()
    for i, blob in enumerate(blobs):
        name = f"modules/bomb{i}.ko.{rng.choice(KINDS)}"  # a suffix proves nothing
        Path(tmp / name).write_bytes(blob)
        entries.append({"file": name, "sha256": hashlib.sha256(blob).hexdigest()})
    data["module"] = entries
    _finish(w, tmp, tomli_w.dumps(data).encode(), _name(rng, rng.choice(["evil", "nvidia"])))


def bomb_stated(rng: random.Random, w: World) -> str:
    kind = rng.choice(KINDS)
    _plant(rng, w, [stated(kind, BIG)])
    return f"bomb-stated-{kind}"


def bomb_unstated(rng: random.Random, w: World) -> str:
    _plant(rng, w, [unstated(BIG)])
    return "bomb-unstated-zst"


def bomb_lying(rng: random.Random, w: World) -> str:
    kind = rng.choice(["zst", "gz"])
    _plant(rng, w, [lying(kind, BIG)])
    return f"bomb-lying-{kind}"


def bomb_after_module(rng: random.Random, w: World) -> str:
    """A small stream, then a bomb stream, frame or member: data after the module."""
    kind = rng.choice(KINDS)
    small = {"xz": lzma.compress(b"\x7fELF"), "zst": stated("zst", 4), "gz": gzip.compress(b"")}
    bomb = unstated(BIG) if kind == "zst" else stated(kind, BIG)
    _plant(rng, w, [small[kind] + bomb])
    return f"bomb-after-module-{kind}"


def many_bombs(rng: random.Random, w: World) -> str:
    """Many bombs under the module cap, which pass the drop's budget together."""
    count = rng.choice([8, 32, 64])
    pick = rng.choice([lambda: unstated(SMALL), lambda: lying("gz", SMALL)])
    _plant(rng, w, [pick() for _ in range(count)])
    return f"many-bombs-{count}"


def bombs_beside_good(rng: random.Random, w: World) -> str:
    """The good module and bombs in one drop: the drop is refused, naming the bombs."""
    _plant(rng, w, [unstated(BIG), lying("zst", BIG)], keep_good=True)
    return "bombs-beside-good"


BOMBS: list[Gen] = [
    bomb_stated,
    bomb_unstated,
    bomb_lying,
    bomb_after_module,
    many_bombs,
    bombs_beside_good,
]

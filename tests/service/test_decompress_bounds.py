"""Decompression bounded before and while it runs: stated sizes, windows, the memory gate,
the per-drop budget, and images spilled to a file rather than held in memory."""

from __future__ import annotations

import gzip
import hashlib
import io
import lzma
import struct
import threading
import time
from pathlib import Path

import pytest
import zstandard

from service.errors import ModuleRejected
from service.verify.checks import Facts, check
from service.verify.compressed import budget
from service.verify.compressed.budget import DropBudget, Gate, per_drop
from service.verify.compressed.decompress import (
    CHUNK,
    Hashed,
    chunks,
    decompress,
    decompress_file,
    decompress_into,
)
from service.verify.compressed.stated import MAX_WINDOW, stated
from service.verify.signature.trust import TrustStore
from service.verify.targetkernel.kernel import Target
from service.verify.verdict import verify_module
from tests.kmod import compress

MiB = 1 << 20


def zstd_streamed(data: bytes) -> bytes:
    """A zstd frame written by a streaming compressor: no content size in its header."""
    c = zstandard.ZstdCompressor().compressobj()
    return c.compress(data) + c.flush()


def gzip_lying(data: bytes, isize: int) -> bytes:
    """A gzip member of ``data`` whose trailer states ``isize`` decompressed bytes."""
    real = gzip.compress(data, mtime=0)
    return real[:-4] + struct.pack("<I", isize)


def zstd_stating(data: bytes, size: int) -> bytes:
    """A zstd frame of ``data`` whose header states ``size`` bytes (a 4-byte size field)."""
    frame = zstandard.ZstdCompressor(write_content_size=True).compress(data)
    descriptor = frame[4]
    assert descriptor >> 6 == 2 and not descriptor & 0x20  # 4-byte size, window byte present
    return frame[:6] + struct.pack("<I", size) + frame[10:]


@pytest.mark.parametrize("kind", ["xz", "zst", "gz"])
def test_stated_size_is_read_from_each_format(kind: str) -> None:
    """The xz index, the zstd frame header and gzip's ISIZE give the decompressed size."""
    data = b"module" * 100_000
    blob = compress(data, kind)
    assert stated(io.BytesIO(blob), kind).size == len(data)


def test_xz_states_the_first_streams_size_and_its_dictionary() -> None:
    """Of several xz streams, the first is the module: its index is found walking back
    over the others and the zero padding between them; its dictionary is the window."""
    first = lzma.compress(b"a" * 5000, filters=[{"id": lzma.FILTER_LZMA2, "dict_size": 1 << 20}])
    blob = first + bytes(8) + lzma.compress(b"b" * 70_000) + lzma.compress(b"c")
    assert stated(io.BytesIO(blob), "xz") == (5000, 1 << 20)


def test_a_file_of_padding_is_not_walked_to_its_start(tmp_path: Path) -> None:
    """xz magic and then 256 MiB of zeros (sparse: nothing written): the walk back over
    stream padding gives up after a bounded number of steps and states nothing."""
    path = tmp_path / "padded.ko.xz"
    with path.open("wb") as f:
        f.write(b"\xfd7zXZ\x00")
        f.truncate(256 * MiB)
    with path.open("rb") as f:
        assert stated(f, "xz").size is None


def test_unknown_or_garbled_sizes_state_nothing() -> None:
    """A streamed zstd frame, a cut xz file, and a gzip trailer deflate cannot reach state
    no size (the stream's cap decides), and an unparsable header the largest window."""
    data = bytes(MiB)
    assert stated(io.BytesIO(zstd_streamed(data)), "zst").size is None
    assert stated(io.BytesIO(compress(data, "xz")[:-30]), "xz").size is None
    assert stated(io.BytesIO(gzip_lying(b"x" * 100, 1 << 30)), "gz").size is None
    assert stated(io.BytesIO(b"\xfd7zXZ\x00" + b"junk" * 10), "xz").window == MAX_WINDOW


def varint(value: int) -> bytes:
    """xz's multibyte integer: seven bits a byte, low first, the top bit set but on the last."""
    out = bytearray()
    while value >= 0x80:
        out.append(value & 0x7F | 0x80)
        value >>= 7
    return bytes([*out, value])


def xz_crafted(
    records: list[tuple[int, int]],
    *,
    blocks: int = 100,
    indicator: int = 0,
    count: int | None = None,
    magic: bytes = b"YZ",
    backward: int | None = None,
) -> bytes:
    """An xz stream whose index states ``records`` (unpadded, uncompressed sizes) after
    ``blocks`` bytes of (zero) blocks: each field may lie; no CRC is right, none is read."""
    body = bytes([indicator]) + varint(len(records) if count is None else count)
    body += b"".join(varint(u) + varint(n) for u, n in records)
    index = body + bytes(-len(body) % 4) + bytes(4)
    size_field = len(index) // 4 - 1 if backward is None else backward
    footer = bytes(4) + struct.pack("<I", size_field) + b"\x00\x01" + magic
    return b"\xfd7zXZ\x00\x00\x01" + bytes(4) + bytes(blocks) + index + footer


#: Without its own check, a stream too short would still fail the index-size check, and
#: records past the index would still run off its end: those two cases pin the outcome.
XZ_LIES = {
    "too short for a stream": b"\x00" * 18 + b"YZ",
    "no stream footer": xz_crafted([(100, 5000)], magic=b"ZY"),
    "no index indicator": xz_crafted([(100, 5000)], indicator=1),
    "more records than the index holds": xz_crafted([(100, 5000)], count=7),
    "blocks larger than the file": xz_crafted([(104, 5000)]),
}


@pytest.mark.parametrize("lie", sorted(XZ_LIES))
def test_an_xz_index_that_does_not_add_up_states_nothing(lie: str) -> None:
    """The index the stated size comes from is believed only if it fits: a file too short
    for a stream, no footer magic, no index indicator, more records than the index has
    room for, or blocks larger than the file before the index state no size (the stream's
    own cap then decides); the same stream with an honest index states 5000."""
    assert stated(io.BytesIO(xz_crafted([(100, 5000)])), "xz").size == 5000
    assert stated(io.BytesIO(XZ_LIES[lie]), "xz").size is None


@pytest.mark.parametrize("index_size", ["past the file's start", "over 16 MiB"])
def test_an_xz_index_larger_than_the_file_or_16_mib_is_not_read(
    tmp_path: Path, index_size: str
) -> None:
    """A footer stating an index that begins before the file does (read from disk: a seek
    before the start is an error there) or is over 16 MiB (in a file large enough: sparse,
    of zeros, which would read as an empty index) states no size and reads no index."""
    path = tmp_path / "lying.ko.xz"
    if index_size == "over 16 MiB":
        index = 16 * MiB + 4  # between the stream header and the footer, nothing else
        with path.open("wb") as f:
            f.write(b"\xfd7zXZ\x00\x00\x01" + bytes(4))
            f.truncate(12 + index)
            f.seek(0, 2)
            f.write(bytes(4) + struct.pack("<I", index // 4 - 1) + b"\x00\x01YZ")
    else:
        path.write_bytes(xz_crafted([(100, 5000)], backward=64))
    with path.open("rb") as f:
        assert stated(f, "xz").size is None


def test_the_dictionary_is_read_only_inside_the_block_header() -> None:
    """The first block header's size byte counts 4-byte words (plus one): a dictionary byte
    that is its last byte is read (4 MiB here), one just past it is not (the largest window
    is assumed), whatever the bytes that follow."""

    def head(size_byte: int, compressed: int) -> bytes:
        block = bytes([size_byte, 0x40]) + varint(compressed) + bytes([0x21, 1, 20])
        return b"\xfd7zXZ\x00\x00\x01" + bytes(4) + block + bytes(16)

    inside, past = head(1, 1 << 14), head(1, 1 << 21)  # a 3- or 4-byte compressed size
    assert (len(varint(1 << 14)), len(varint(1 << 21))) == (3, 4)
    assert stated(io.BytesIO(inside), "xz").window == 4 * MiB
    assert stated(io.BytesIO(past), "xz").window == MAX_WINDOW
    assert stated(io.BytesIO(head(2, 1 << 21)), "xz").window == 4 * MiB


@pytest.mark.parametrize("kind", ["xz", "zst", "gz"])
def test_a_bomb_that_states_its_size_is_refused_before_decompressing(
    kind: str, tmp_path: Path, trust: TrustStore, target: Target
) -> None:
    """Over the cap by its header: EFBIG naming the cap, not one byte decompressed, and
    the stored file's digest still known."""
    blob = compress(bytes(64 * MiB), kind)
    drop = DropBudget(1 << 30, str(tmp_path))
    facts = Facts("bomb")
    with pytest.raises(ModuleRejected) as refused:
        check(io.BytesIO(blob), facts, trust, target, 4 * MiB, drop)
    assert str(refused.value.refusal) == f"EFBIG: decompressed module exceeds {4 * MiB} bytes"
    assert drop.total == 0
    assert facts.fields["sha256"] == hashlib.sha256(blob).hexdigest()


@pytest.mark.parametrize(
    ("kind", "blob"),
    [
        ("zst", zstd_streamed(bytes(64 * MiB))),
        ("zst", zstd_stating(bytes(64 * MiB), 4096)),
        ("gz", gzip_lying(bytes(64 * MiB), 4096)),
    ],
    ids=["zstd-unstated", "zstd-lying", "gzip-isize-lying"],
)
def test_a_size_that_is_not_stated_or_lies_is_caught_by_the_stream(
    kind: str, blob: bytes, tmp_path: Path, trust: TrustStore, target: Target
) -> None:
    """The header proves nothing: a bomb that states no size, or a small one, is stopped
    by the streaming cap (or by the decompressor itself) within one chunk past it."""
    drop = DropBudget(1 << 30, str(tmp_path))
    with pytest.raises(ModuleRejected) as refused:
        check(io.BytesIO(blob), Facts("bomb"), trust, target, 4 * MiB, drop)
    assert refused.value.refusal.errno in ("EFBIG", "EINVAL"), refused.value.refusal
    assert drop.total <= 4 * MiB + CHUNK


def test_a_window_over_the_limit_is_refused_before_decompressing(
    tmp_path: Path, trust: TrustStore, target: Target
) -> None:
    """A zstd frame asking for a 2 GiB window: EFBIG naming it, nothing decompressed."""
    frame = bytearray(zstd_streamed(bytes(MiB)))
    assert not frame[4] & 0x20  # a window descriptor follows the frame header descriptor
    frame[5] = 21 << 3  # window log 10 + 21 = 31
    drop = DropBudget(1 << 30, str(tmp_path))
    with pytest.raises(ModuleRejected) as refused:
        check(io.BytesIO(bytes(frame)), Facts("wide"), trust, target, 512 * MiB, drop)
    assert refused.value.refusal.errno == "EFBIG"
    assert f"window of {1 << 31} bytes" in refused.value.refusal.message
    assert drop.total == 0


def test_the_decompressor_is_held_to_the_window_it_was_admitted_for() -> None:
    """A stream whose later part asks for more than the window admitted is refused as corrupt
    (xz's memory limit, zstd's largest window), not given the memory."""
    blob = lzma.compress(bytes(4 * MiB), filters=[{"id": lzma.FILTER_LZMA2, "dict_size": 8 * MiB}])
    with pytest.raises(ModuleRejected, match="corrupt xz stream"):
        b"".join(chunks(io.BytesIO(blob).read, "xz", window=1 * MiB))
    frame = zstandard.ZstdCompressor(level=19).compress(bytes(4 * MiB))
    with pytest.raises(ModuleRejected, match="corrupt zst stream"):
        b"".join(chunks(io.BytesIO(frame).read, "zst", window=64 << 10))


@pytest.mark.parametrize("kind", ["xz", "zst", "gz"])
def test_the_cap_is_exact(kind: str) -> None:
    """A stream that makes exactly ``cap`` bytes decompresses whole; with a cap one byte
    smaller it is refused (EFBIG naming that cap)."""
    data = bytes(range(256)) * 1000
    blob = compress(data, kind)
    assert b"".join(chunks(io.BytesIO(blob).read, kind, len(data))) == data
    with pytest.raises(ModuleRejected, match=f"exceeds {len(data) - 1} bytes"):
        b"".join(chunks(io.BytesIO(blob).read, kind, len(data) - 1))


@pytest.mark.parametrize("kind", ["xz", "zst", "gz"])
def test_decompressed_pieces_are_bounded(kind: str) -> None:
    """However much a piece of input expands, no piece of output is larger than a chunk
    (zstd's: two MiB), so memory does not follow the compression ratio."""
    data = bytes(48 * MiB) + b"tail"
    blob = zstd_streamed(data) if kind == "zst" else compress(data, kind)
    sizes = [len(piece) for piece in chunks(io.BytesIO(blob).read, kind, 64 * MiB)]
    assert sum(sizes) == len(data)
    assert max(sizes) <= (2 * MiB if kind == "zst" else CHUNK)


@pytest.mark.parametrize("kind", ["xz", "zst", "gz"])
def test_decompress_into_writes_the_image_and_counts_it(kind: str, tmp_path: Path) -> None:
    """The image goes to the file as it streams; every piece is counted first."""
    data = b"\x7fELF" + bytes(range(256)) * 40_000
    counted: list[int] = []
    with (tmp_path / "image").open("w+b") as out:
        size = decompress_into(io.BytesIO(compress(data, kind)), kind, out, count=counted.append)
        out.seek(0)
        assert out.read() == data
    assert size == sum(counted) == len(data)


def test_several_frames_or_members_are_refused_after_the_first() -> None:
    """A second zstd frame or gzip member (a bomb after a small module) is data after the
    end of the module's stream: refused, whatever it would expand to."""
    for kind, blob in (
        ("zst", compress(b"module", "zst") + zstd_streamed(bytes(64 * MiB))),
        ("gz", compress(b"module", "gz") + compress(bytes(64 * MiB), "gz")),
        ("xz", compress(b"module", "xz") + compress(bytes(64 * MiB), "xz")),
    ):
        with pytest.raises(ModuleRejected, match="data after the end"):
            b"".join(chunks(io.BytesIO(blob).read, kind))


@pytest.mark.parametrize("kind", ["xz", "zst", "gz"])
def test_a_whole_file_is_hashed_even_when_its_stream_is_refused(kind: str) -> None:
    """``decompress_file`` refuses data after the stream by default (a module is exact, as
    is ``decompress`` called without ``exact``), yet every byte of the file, the trailing
    ones too, goes through the digest it is given: the stored file's sha256 is known either
    way. Without a digest of the caller's it decompresses all the same."""
    data = b"\x7fELF" + bytes(range(256)) * 300
    blob = compress(data, kind) + b"trailing junk" * (CHUNK // 4)  # over 3 CHUNKs
    hashed = Hashed()
    with pytest.raises(ModuleRejected, match="data after the end"):
        decompress_file(io.BytesIO(blob), kind, hashed=hashed)
    assert hashed.sha256.hexdigest() == hashlib.sha256(blob).hexdigest()
    with pytest.raises(ModuleRejected, match="data after the end"):
        decompress(io.BytesIO(blob).read, kind)
    assert decompress(io.BytesIO(blob).read, kind, exact=False) == data
    assert decompress_file(io.BytesIO(compress(data, kind)), kind) == data


def test_the_gate_admits_costs_while_they_fit() -> None:
    """Two costs that fit run together; a third waits until one leaves; a cost larger than
    the budget is admitted alone."""
    gate = Gate(10)
    entered = threading.Event()
    with gate.admitted(4), gate.admitted(4):
        assert gate.held == 8

        def third() -> None:
            with gate.admitted(4):
                entered.set()

        waiter = threading.Thread(target=third)
        waiter.start()
        time.sleep(0.2)
        assert not entered.is_set() and gate.held == 8
    waiter.join(5)
    assert entered.is_set() and gate.held == 0 and gate.peak == 8
    with gate.admitted(50):
        assert gate.held == 50


def test_the_drop_budget_refuses_past_its_limit() -> None:
    """Bytes are counted across a drop's modules; the one that passes the limit is refused
    naming the configuration key."""
    drop = DropBudget(10)
    drop.add(6)
    assert drop.left() == 4
    with pytest.raises(ModuleRejected, match=r"limits\.max_decompressed_bytes"):
        drop.add(5)


def test_per_drop_sets_the_limit_and_spill_of_what_is_verified_within(tmp_path: Path) -> None:
    """Intake's limit and private directory hold inside the block, the defaults outside."""
    outside = budget.drop_budget()
    with per_drop(123, spill=tmp_path):
        inside = budget.drop_budget()
    assert (inside.limit, inside.spill) == (123, str(tmp_path))
    assert (budget.drop_budget().limit, budget.drop_budget().spill) == (outside.limit, None)


def test_workers_follow_the_override(monkeypatch: pytest.MonkeyPatch) -> None:
    """Without the override, one worker per core but never more than MAX_WORKERS, whatever
    the host's cores; MODSTAGE_VERIFY_WORKERS sets them (never more than the jobs, at
    least one)."""
    monkeypatch.delenv(budget.WORKERS_ENV, raising=False)
    monkeypatch.setattr(budget.os, "cpu_count", lambda: 256)
    assert budget.workers(100) == budget.MAX_WORKERS
    monkeypatch.setenv(budget.WORKERS_ENV, "64")
    assert (budget.workers(100), budget.workers(3)) == (64, 3)
    monkeypatch.setenv(budget.WORKERS_ENV, "0")
    assert budget.workers(5) == 1


@pytest.mark.parametrize("kind", ["xz", "zst", "gz"])
def test_a_compressed_module_verifies_from_its_spilled_image(
    kind: str, signed_rsa: Path, trust: TrustStore, target: Target, tmp_path: Path
) -> None:
    """The module still verifies (image digest and all) when its image lives in a file
    in the spill directory, and nothing is left there afterwards."""
    data = signed_rsa.read_bytes()
    with per_drop(1 << 30, spill=tmp_path):
        verdict = verify_module(
            io.BytesIO(compress(data, kind)), display="m", trust=trust, kernel=target
        )
    assert verdict.ok, verdict.reason
    assert verdict.image_sha256 == hashlib.sha256(data).hexdigest()
    assert list(tmp_path.iterdir()) == []

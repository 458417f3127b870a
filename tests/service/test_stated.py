"""What a compressed module's own headers state: the xz block header's dictionary (its flag
bits, its filter chain, its multibyte integers), the xz index's size, gzip's ISIZE, the zstd
window. Files come from the real ``xz``, ``gzip`` and ``zstd`` tools where they can;
malformed ones are crafted byte by byte after the formats' specifications."""

from __future__ import annotations

import io
import re
import struct
import subprocess
import zlib
from pathlib import Path

import pytest

from service.verify.compressed.stated import MAX_WINDOW, MAX_XZ_STEPS, _varint, _xz_window, stated
from tests.service.test_decompress_bounds import varint

MiB = 1 << 20
LZMA2, DELTA, X86, SPARC = 0x21, 0x03, 0x04, 0x09
XZ_MAGIC = b"\xfd7zXZ\x00"
UNITS = {"B": 1, "KiB": 1 << 10, "MiB": 1 << 20, "GiB": 1 << 30}


def tool(argv: list[str], data: bytes = b"") -> bytes:
    """What the command writes to stdout given ``data`` on stdin."""
    return subprocess.run(argv, input=data, stdout=subprocess.PIPE, check=True).stdout


def sample(size: int) -> bytes:
    """``size`` bytes that compress a little, as a module's code does."""
    return bytes(i * 7 % 251 for i in range(size))


def spec_dictionary(props: int) -> int:
    """The LZMA2 dictionary size of property byte ``props`` (xz file format 1.1.0, 5.3.1):
    40 is 4 GiB - 1; below it ``2 or 3`` shifted left by ``props // 2 + 11``."""
    return 0xFFFF_FFFF if props == 40 else (2 | (props & 1)) << (props // 2 + 11)


def block_header(
    filters: list[tuple[int, bytes]], compressed: int | None = None, uncompressed: int | None = None
) -> bytes:
    """An xz block header (format 3.1): size byte, flags (the filter count less one; 0x40,
    0x80: the sizes that follow), the filter flags, zero padding and its CRC32."""
    flags = len(filters) - 1
    body = b""
    if compressed is not None:
        flags |= 0x40
        body += varint(compressed)
    if uncompressed is not None:
        flags |= 0x80
        body += varint(uncompressed)
    body += b"".join(varint(fid) + varint(len(props)) + props for fid, props in filters)
    size = -(-(2 + len(body) + 4) // 4) * 4
    header = bytes([size // 4 - 1, flags]) + body
    header += bytes(size - 4 - len(header))
    return header + struct.pack("<I", zlib.crc32(header))


def xz_head(header: bytes) -> bytes:
    """The start of an xz file: its stream header, then ``header`` and some block data."""
    flags = b"\x00\x01"
    return XZ_MAGIC + flags + struct.pack("<I", zlib.crc32(flags)) + header + bytes(64)


def xz_listed(blob: bytes, tmp_path: Path) -> tuple[str, int]:
    """What ``xz --list`` reads in the first block header of ``blob``: the sizes present
    (``cu``: both, ``--``: neither) and the LZMA2 dictionary of its filter chain."""
    path = tmp_path / "listed.xz"
    path.write_bytes(blob)
    listing = tool(["xz", "--robot", "--list", "-vv", str(path)]).decode()
    block = next(line.split("\t") for line in listing.splitlines() if line.startswith("block"))
    found = re.search(r"--lzma2=\S*dict=(\d+)(B|KiB|MiB|GiB)", block[-1])
    assert found, block
    return block[12], int(found[1]) * UNITS[found[2]]


@pytest.mark.parametrize("props", range(41))
def test_the_lzma2_dictionary_follows_the_specification(props: int) -> None:
    """Every LZMA2 property byte states the dictionary the xz specification gives it."""
    header = block_header([(LZMA2, bytes([props]))])
    assert _xz_window(xz_head(header)) == spec_dictionary(props)


def test_reserved_property_bits_are_ignored_and_sizes_past_40_are_refused_widths() -> None:
    """The two reserved bits of the property byte do not change the dictionary; a property
    over 40 (invalid) states 4 GiB - 1, more than any window modstage admits."""
    for props in (0, 1, 16, 19, 39):
        for reserved in (0x40, 0x80, 0xC0):
            header = block_header([(LZMA2, bytes([props | reserved]))])
            assert _xz_window(xz_head(header)) == spec_dictionary(props)
    for props in range(41, 64):
        header = block_header([(LZMA2, bytes([props]))])
        assert _xz_window(xz_head(header)) == 0xFFFF_FFFF > MAX_WINDOW


CHAINS = {
    "lzma2": [],
    "sizes in the header (threads)": ["-T2"],
    "x86 before lzma2": ["--x86"],
    "delta (a property byte) before lzma2": ["--delta=dist=4"],
}


@pytest.mark.parametrize("chain", sorted(CHAINS))
@pytest.mark.parametrize("dictionary", ["4KiB", "6KiB", "1MiB", "1536KiB", "3MiB"])
def test_the_window_is_the_dictionary_xz_writes(
    chain: str, dictionary: str, tmp_path: Path
) -> None:
    """For files the real ``xz`` writes, alone or after other filters, with the sizes in the
    block header or not, the window is the dictionary ``xz --list`` reads there, and the
    size the data's."""
    options = CHAINS[chain] or ["-T1"]
    data = sample(100_000)
    blob = tool(["xz", "-c", *options, f"--lzma2=dict={dictionary}"], data)
    sizes, listed = xz_listed(blob, tmp_path)
    assert sizes == ("cu" if "-T2" in options else "--")
    assert stated(io.BytesIO(blob), "xz") == (len(data), listed)


SIZES = {"neither": (None, None), "compressed": (1 << 14, None), "uncompressed": (None, 1 << 21)}
SIZES["both"] = (1 << 14, 1 << 21)
FILTERS = {
    "lzma2": [],
    "x86, lzma2": [(X86, b"")],
    "delta, lzma2": [(DELTA, b"\x03")],
    "delta, x86, sparc, lzma2": [(DELTA, b"\x03"), (X86, b""), (SPARC, b"")],
}


@pytest.mark.parametrize("sizes", sorted(SIZES))
@pytest.mark.parametrize("before", sorted(FILTERS))
def test_the_block_flags_say_what_comes_before_the_dictionary(sizes: str, before: str) -> None:
    """The flags' sizes (compressed 0x40, uncompressed 0x80, multibyte here) are skipped and
    their filter count (low two bits, plus one) is walked, each filter's properties skipped,
    up to LZMA2's dictionary: 3 MiB, whatever comes before it."""
    compressed, uncompressed = SIZES[sizes]
    header = block_header([*FILTERS[before], (LZMA2, b"\x13")], compressed, uncompressed)
    assert _xz_window(xz_head(header)) == spec_dictionary(0x13) == 3 * MiB


@pytest.mark.parametrize("count", [1, 2, 3])
def test_filters_past_the_count_in_the_flags_are_not_read(count: int) -> None:
    """A chain whose last counted filter is not LZMA2 states the largest window, even when
    the header's next bytes would read as an LZMA2 filter."""
    header = bytearray(block_header([*[(DELTA, b"\x03")] * count, (LZMA2, b"\x10")]))
    header[1] -= 1  # one filter fewer: LZMA2 is no longer counted
    assert _xz_window(xz_head(bytes(header))) == MAX_WINDOW
    header[1] += 1
    assert _xz_window(xz_head(bytes(header))) == MiB


@pytest.mark.parametrize("value", [0, 1, 0x21, 0x7F, 0x80, 0x81, 0x3FFF, 0x4000, (1 << 63) - 1])
def test_a_multibyte_integer_reads_as_the_specification_writes_it(value: int) -> None:
    """Read where it starts (after other bytes), the integer gives its value and the offset
    just after it, whatever follows."""
    encoded = varint(value)
    assert len(encoded) <= 9
    assert _varint(b"\xff\x00\x80" + encoded + b"\x81\xff", 3) == (value, 3 + len(encoded))


def test_a_multibyte_integer_longer_than_nine_bytes_is_refused() -> None:
    """Nine bytes is the most (63 bits): a tenth is refused, and a block header holding
    such a size states the largest window rather than failing."""
    nine = bytes([0xFF] * 8 + [0x7F])
    assert _varint(nine, 0) == ((1 << 63) - 1, 9)
    ten = bytes([0x80] * 9 + [0x01])
    with pytest.raises(ValueError, match="longer than 9 bytes"):
        _varint(ten + b"\x00", 0)
    header = bytes([7, 0x40]) + ten + bytes([LZMA2, 1, 0x10]) + bytes(16)
    assert stated(io.BytesIO(xz_head(header)), "xz").window == MAX_WINDOW


def gzip_with_trailer(blob: bytes, isize: int) -> bytes:
    """``blob`` with its last four bytes (a gzip member's ISIZE) saying ``isize``."""
    return blob[:-4] + struct.pack("<I", isize)


def test_gzip_states_its_isize_and_deflates_window() -> None:
    """A file the real ``gzip`` writes states its data's size (ISIZE, the last four bytes)
    and deflate's 32 KiB window (RFC 1951: distances reach back 32768 bytes)."""
    for data in (b"", sample(1000), sample(300_000)):
        for level in ("-1", "-9"):
            blob = tool(["gzip", "-c", "-n", level], data)
            assert stated(io.BytesIO(blob), "gz") == (len(data), 1 << zlib.MAX_WBITS)


def test_a_gzip_file_shorter_than_header_and_trailer_states_nothing() -> None:
    """A gzip member is at least its 10-byte header and 8-byte trailer (RFC 1952): 17 bytes
    state no size, 18 state their ISIZE."""
    header = tool(["gzip", "-c", "-n"], b"")[:10]
    for isize in (0, 5, 17):
        trailer = struct.pack("<II", 0, isize)
        assert stated(io.BytesIO(header + trailer), "gz").size == isize
        assert stated(io.BytesIO(header[:-1] + trailer), "gz").size is None


def test_an_isize_past_deflates_ratio_states_nothing() -> None:
    """Deflate makes at most 1032 bytes of one (zlib's technical details): an ISIZE up to
    1032 times the file's size is believed, one more is not a trailer."""
    blob = tool(["gzip", "-c", "-n", "-9"], bytes(MiB))
    assert len(blob) * 1032 >= MiB  # the real tool stays under the ratio
    bound = 1032 * len(blob)
    assert stated(io.BytesIO(gzip_with_trailer(blob, bound)), "gz").size == bound
    assert stated(io.BytesIO(gzip_with_trailer(blob, bound + 1)), "gz").size is None


def zstd_window(frame: bytes) -> int:
    """The window a zstd frame header's window descriptor gives (RFC 8878, 3.1.1.1.2)."""
    descriptor = frame[5]
    base = 1 << (10 + (descriptor >> 3))
    return base + base // 8 * (descriptor & 7)


@pytest.mark.parametrize("options", [[], ["--long=24"], ["-1"]], ids=str)
def test_zstd_streamed_from_a_pipe_states_its_window_descriptor(options: list[str]) -> None:
    """A frame ``zstd`` writes from a pipe states no size; its window is the window
    descriptor's."""
    frame = tool(["zstd", "-q", "-c", *options], sample(MiB))
    assert not frame[4] & 0x20 and not frame[4] & 0xC0  # a window descriptor, no size
    assert stated(io.BytesIO(frame), "zst") == (None, zstd_window(frame))


def test_zstd_of_a_file_states_its_size_as_its_window(tmp_path: Path) -> None:
    """A frame ``zstd`` writes of a file is one segment: its size is stated and is its
    window; an empty one states a window of one byte (a cost is never nothing)."""
    for size in (0, 1000, MiB):
        path = tmp_path / "module.ko"
        path.write_bytes(sample(size))
        frame = tool(["zstd", "-q", "-c", str(path)])
        assert frame[4] & 0x20  # single segment
        assert stated(io.BytesIO(frame), "zst") == (size, max(size, 1))


def test_an_unreadable_zstd_header_states_the_largest_window() -> None:
    """A frame header that does not parse states nothing and the largest window."""
    assert stated(io.BytesIO(b"\x28\xb5\x2f\xfd"), "zst") == (None, MAX_WINDOW)


def xz_crafted(unpadded: int, blocks: int, uncompressed: int = 5000) -> bytes:
    """A stream of ``blocks`` (zero) bytes of blocks whose one-record index says
    ``unpadded``, ``uncompressed``; no CRC is right, none is read."""
    body = b"\x00\x01" + varint(unpadded) + varint(uncompressed)
    index = body + bytes(-len(body) % 4) + bytes(4)
    footer = bytes(4) + struct.pack("<I", len(index) // 4 - 1) + b"\x00\x01YZ"
    return XZ_MAGIC + b"\x00\x01" + bytes(4) + bytes(blocks) + index + footer


def stated_from_disk(blob: bytes, tmp_path: Path) -> int | None:
    """The size ``blob`` states, read from a file (a seek before its start is an error
    there, not in memory)."""
    path = tmp_path / "module.ko.xz"
    path.write_bytes(blob)
    with path.open("rb") as f:
        return stated(f, "xz").size


@pytest.mark.parametrize("unpadded", [97, 98, 99, 100, 101])
def test_block_sizes_are_padded_to_four_bytes(unpadded: int, tmp_path: Path) -> None:
    """An index record's unpadded size is rounded up to four bytes: 97 to 100 fill 100 bytes
    of blocks exactly and state the record's size; 101 does not fit and states nothing, nor
    do blocks that would start a byte before the file."""
    fits = unpadded <= 100
    assert stated_from_disk(xz_crafted(unpadded, 100), tmp_path) == (5000 if fits else None)
    assert stated_from_disk(xz_crafted(unpadded, 99), tmp_path) is None


@pytest.mark.parametrize("start", [1, 2, 3])
def test_a_stream_starting_inside_the_first_word_states_nothing(start: int, tmp_path: Path) -> None:
    """An index whose blocks put its stream's start one to three bytes into the file leaves
    bytes that are neither padding nor a stream before it: nothing is stated (the
    decompressor says what is wrong), rather than a seek before the file's start failing
    as if the file could not be read."""
    assert stated_from_disk(xz_crafted(96, 96 + start), tmp_path) is None


def test_an_empty_xz_stream_states_nothing_decompressed(tmp_path: Path) -> None:
    """``xz`` of nothing is a 32-byte stream (header, empty index, footer): it states 0."""
    blob = tool(["xz", "-c"])
    assert stated_from_disk(blob, tmp_path) == 0
    assert stated_from_disk(blob + bytes(4), tmp_path) == 0


def test_every_block_of_the_index_is_counted(tmp_path: Path) -> None:
    """A file ``xz`` writes in a hundred small blocks (an index of a hundred two-byte
    records) states the sum of their sizes."""
    data = bytes(10_000)
    blob = tool(["xz", "-c", "-T1", "--block-size=100"], data)
    assert stated_from_disk(blob, tmp_path) == len(data)


def test_an_index_of_16_mib_is_read(tmp_path: Path) -> None:
    """16 MiB is the largest index read: one of that size (all zeros: no records) states
    that its stream decompresses to nothing."""
    path = tmp_path / "large-index.ko.xz"
    index = 16 * MiB
    with path.open("wb") as f:
        f.write(XZ_MAGIC + b"\x00\x01" + bytes(4))
        f.truncate(12 + index)
        f.seek(0, 2)
        f.write(bytes(4) + struct.pack("<I", index // 4 - 1) + b"\x00\x01YZ")
    with path.open("rb") as f:
        assert stated(f, "xz").size == 0


def test_the_walk_over_padding_stops_after_its_steps(tmp_path: Path) -> None:
    """Each word of stream padding and each stream is a step, and reaching the file's start
    one more: a stream followed by ``MAX_XZ_STEPS - 2`` words of padding states its size,
    one word more states nothing."""
    blob = tool(["xz", "-c"], b"module")
    assert stated_from_disk(blob + bytes(4 * (MAX_XZ_STEPS - 2)), tmp_path) == 6
    assert stated_from_disk(blob + bytes(4 * (MAX_XZ_STEPS - 1)), tmp_path) is None


def test_an_xz_file_cut_before_its_footer_could_fit_states_nothing(tmp_path: Path) -> None:
    """A file ``xz`` wrote, cut to fewer bytes than a stream header and footer (24), states
    nothing; it is not read before its start."""
    blob = tool(["xz", "-c"], b"module")
    for size in range(len(XZ_MAGIC), 24):
        assert stated_from_disk(blob[:size], tmp_path) is None


def test_an_index_reaching_into_the_stream_header_is_not_read(tmp_path: Path) -> None:
    """A footer stating an index one to six words longer than the room between the stream
    header and itself states nothing, read from disk (no seek before the file's start)."""
    blob = tool(["xz", "-c"], b"module")
    room = len(blob) - 24
    for words in range(1, 7):
        index = room + 4 * words
        footer = blob[-12:-8] + struct.pack("<I", index // 4 - 1) + blob[-4:]
        assert stated_from_disk(blob[:-12] + footer, tmp_path) is None

"""The target's facts read lazily equal the facts read whole."""

from __future__ import annotations

from pathlib import Path

from hypothesis import given
from hypothesis import strategies as st

from service.verify.symvers import SymbolCrcs, parse_symvers
from service.verify.target import ConfigText, KernelConfig, parse_config

NAMES = st.sampled_from(["CONFIG_A", "CONFIG_AB", "CONFIG_B", "A", "CONFIG_", "# CONFIG_A"])
VALUES = st.sampled_from(["y", "m", '"x y"', " y ", "", "=y", "n"])
BREAKS = st.sampled_from(["\n", "\n", "\n", "\r\n", "\x0c", "\u2028", " "])
LINES = st.lists(st.tuples(NAMES, st.sampled_from(["=", " is not set", "=="]), VALUES, BREAKS))


@given(LINES, NAMES)
def test_config_lookup_equals_the_whole_parse(lines: list[tuple[str, ...]], asked: str) -> None:
    """Any option looked up in a configuration text has the value the whole parse gives."""
    text = "".join("".join(line) for line in lines)
    whole = parse_config(text)
    lazy = ConfigText(text)
    assert lazy.get(asked) == whole.get(asked)
    assert dict(lazy) == whole


def test_kernel_config_enabled_reads_the_last_line() -> None:
    """``enabled`` sees the last assignment of an option, as the whole parse did."""
    config = KernelConfig.parse("CONFIG_X=n\n# CONFIG_Y is not set\nCONFIG_X=m\n", "t")
    assert config.enabled("X") and not config.enabled("Y") and not config.enabled("Z")


SYMS = st.sampled_from(["a", "b", "mod", "0x1"])
CRCS = st.sampled_from(["0x1", "0xffffffff", "0xzz", "12", "0x_1", ""])
SYMVERS = st.lists(st.lists(st.one_of(SYMS, CRCS), min_size=1, max_size=6).map("\t".join)).map(
    lambda rows: "".join(r + "\n" for r in rows)
)


@given(SYMVERS)
def test_symbol_crcs_read_on_first_use(tmp_path_factory: object, text: str) -> None:
    """The lazy CRC map holds the probed CRCs overridden by every well-formed symvers line."""
    path = Path(tmp_path_factory.mktemp("s")) / "Module.symvers"  # type: ignore[attr-defined]
    path.write_text(text)
    crcs = SymbolCrcs({"a": 7, "z": 9}, path)
    expected = {"a": 7, "z": 9} | parse_symvers(text.splitlines(keepends=True))
    assert dict(crcs) == expected
    assert ("z" in crcs) and crcs["z"] == 9


def test_symbol_crcs_without_a_file_are_the_probe() -> None:
    """No readable Module.symvers: the map is the probed module's CRCs alone."""
    crcs = SymbolCrcs({"module_layout": 1}, None)
    assert dict(crcs) == {"module_layout": 1} and len(crcs) == 1

"""The target's facts read lazily equal the facts read whole."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from service.errors import TargetFileError
from service.verify.targetkernel.exports import read_symvers
from service.verify.targetkernel.kconfig import ConfigText, KernelConfig, parse_config

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


SYMS = st.sampled_from(["a", "b", "mod", "0x1", "vmlinux", "EXPORT_SYMBOL_GPL", "NS"])
CRCS = st.sampled_from(["0x1", "0xffffffff", "0xzz", "12", "0x_1", ""])
SYMVERS = st.lists(st.lists(st.one_of(SYMS, CRCS), min_size=1, max_size=6).map("\t".join)).map(
    lambda rows: "".join(r + "\n" for r in rows)
)


@given(SYMVERS)
def test_module_symvers_lines_become_exports(tmp_path_factory: object, text: str) -> None:
    """Every line with a 0x CRC and at least four fields is an export (the later line of a
    symbol wins); its GPL flag is the export kind's, its namespace the fifth field."""
    path = Path(tmp_path_factory.mktemp("s")) / "Module.symvers"  # type: ignore[attr-defined]
    path.write_text(text)
    expected = {}
    for line in text.splitlines():
        fields = line.split("\t")
        if len(fields) >= 4 and fields[0].startswith("0x"):
            try:
                crc = int(fields[0], 16)
            except ValueError:
                continue
            expected[fields[1]] = (crc, fields[3].endswith("_GPL"), [*fields, ""][4])
    got = {n: (e.crc, e.gpl, e.namespace) for n, e in read_symvers(path).items()}
    assert got == expected


def test_unreadable_module_symvers_names_the_file(tmp_path: Path) -> None:
    """A Module.symvers that cannot be read is an error naming it, not an empty table."""
    with pytest.raises(TargetFileError, match=r"Module\.symvers: cannot read"):
        read_symvers(tmp_path / "Module.symvers")

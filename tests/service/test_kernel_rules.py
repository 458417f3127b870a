"""The kernel rule table (`service.verify.targetkernel.rules`): each row decides Debian's three
kernels (12's 6.1, 13's 6.12, sid's 7.2) as their own files say, an unreadable fact is
assumed as the row says, and every knob of `KernelRules` comes from exactly one row."""

from __future__ import annotations

import re
from dataclasses import fields
from pathlib import Path

import pytest

from service.layout import Layout
from service.verify.targetkernel.kconfig import KernelConfig
from service.verify.targetkernel.kernel import Target
from service.verify.targetkernel.rules import (
    DIGESTS,
    NEWEST,
    OLDEST,
    ROWS,
    KernelRules,
    Since,
    Symbol,
    Until,
    version_of,
)
from tests.service.test_kernel_files import _target_root
from tests.vm.harness.kernel import SERIES, Kernel

# the fields of KernelRules that no row sets: what the rules are of, and two config facts
# with more than one value (the digest names, modversions unknown without a config)
_NOT_KNOBS = {"release", "version", "hashes", "modversions"}


def _set(config: str, symbol: str) -> bool:
    """Whether the kconfig text sets ``CONFIG_<symbol>`` to y or m (its last assignment)."""
    found = re.findall(rf"^CONFIG_{symbol}=(.*)$", config, re.M)
    return bool(found) and found[-1].strip() in ("y", "m")


@pytest.mark.parametrize("series", SERIES)
def test_every_row_decides_each_kernel_as_its_own_files_say(series: str, tmp_path: Path) -> None:
    """The rules of a `Target` read from a Debian kernel's files hold, row by row, what
    that kernel's config text says of the row's symbol (read here with a regular expression,
    not `KernelConfig`) or what its release series says of the row's release; its digests
    and modversions are its config's too."""
    kernel = Kernel.named(series)
    target = Target.from_layout(Layout(_target_root(kernel, tmp_path / "root")), kernel.release)
    rules = target.rules
    config = kernel.config.read_text(errors="replace")
    major, minor = (int(n) for n in series.split("."))
    for row in ROWS:
        decided = row.decided_by
        if isinstance(decided, Symbol):
            want = _set(config, decided.symbol)
        elif isinstance(decided, Since):
            want = (major, minor) >= decided.release
        else:
            want = (major, minor) < decided.release
        assert getattr(rules, row.knob) is want, (series, row.knob)
    assert rules.hashes == {h for h, symbol in DIGESTS.items() if _set(config, symbol)}
    assert rules.modversions is _set(config, "MODVERSIONS")
    assert rules.version == (major, minor)


def test_the_three_kernels_differ_where_the_table_says_they_do(tmp_path: Path) -> None:
    """Rows decided by the release split Debian's kernels as the kernels differ: 6.1 has
    SM2 and MD4/MD5 and no 6.4 checks, 6.12 the 6.4 and 6.12 ELF checks and keyUsage, 7.2
    ML-DSA's OIDs, the ignored `__ksymtab_gpl` and no modversions."""
    got = {}
    for series in SERIES:
        kernel = Kernel.named(series)
        root = _target_root(kernel, tmp_path / series)
        got[series] = Target.from_layout(Layout(root), kernel.release).rules
    old, mid, new = got["6.1"], got["6.12"], got["7.2"]
    assert (old.sm2, old.md4_md5, old.elf_6_4, old.key_usage) == (True, True, False, False)
    assert (mid.sm2, mid.elf_6_4, mid.elf_6_12, mid.key_usage) == (False, True, True, True)
    assert (mid.ml_dsa, mid.gpl_section_ignored, mid.hash_denylist) == (False, False, True)
    assert (new.ml_dsa, new.gpl_section_ignored, new.init_eexist_is_ebusy) == (True, True, True)
    assert (new.hash_denylist, new.modversions) == (False, False)


def test_an_unreadable_release_and_config_are_assumed_as_each_row_says() -> None:
    """With a release that does not parse and no config, each knob is its row's
    `unreadable` value: the newest kernel's rules and the less capable build's config."""
    rules = KernelRules.of("unknown", KernelConfig.missing("not read"))
    assert rules.version == NEWEST
    for row in ROWS:
        assert getattr(rules, row.knob) is row.unreadable, row.knob
    assert rules.modversions is None
    assert rules.hashes == {"sha224", "sha256", "sha384", "sha512"}


def test_every_knob_is_set_by_exactly_one_row() -> None:
    """The table and `KernelRules` name the same knobs, each once: a knob no row sets, or
    one two rows set, shows here."""
    knobs = [row.knob for row in ROWS]
    assert len(knobs) == len(set(knobs))
    assert set(knobs) == {f.name for f in fields(KernelRules)} - _NOT_KNOBS


def test_newest_and_oldest_stand_on_either_side_of_every_release_row() -> None:
    """`KernelRules.newest()` applies every rule a release introduced and none it removed;
    `KernelRules.oldest()` (6.1) the reverse for every row after 6.1. Both hold EC keys and
    compute the digests they are given."""
    newest, oldest = KernelRules.newest(), KernelRules.oldest(frozenset({"sha256"}))
    for row in ROWS:
        decided = row.decided_by
        if isinstance(decided, Symbol):
            continue
        assert getattr(newest, row.knob) is isinstance(decided, Since), row.knob
        if decided.release > OLDEST:
            assert getattr(oldest, row.knob) is isinstance(decided, Until), row.knob
    assert newest.ecdsa and oldest.ecdsa
    assert (newest.hashes, oldest.hashes) == (frozenset(), {"sha256"})


@pytest.mark.parametrize(
    ("release", "version"),
    [("6.12.117+deb13-amd64", (6, 12)), ("7.2.13+deb14-amd64", (7, 2)), ("vmlinuz", NEWEST)],
)
def test_a_release_is_read_as_its_major_and_minor(release: str, version: tuple[int, int]) -> None:
    """`version_of` takes the first two numbers of a Debian release; anything else counts
    as newer than every row."""
    assert version_of(release) == version

"""Kernel parameter strings: parsing, canonical spelling, merging."""

from __future__ import annotations

import pytest
from hypothesis import given

from stager.schema.params import ParamsError, format_params, merge_params, parse_params
from tests.strategies import params


@given(params())
def test_canonical_strings_round_trip(text: str) -> None:
    """A canonical parameter string parses and formats back to itself."""
    assert format_params(parse_params(text)) == text


def test_quotes_spaces_and_bare_names_split_as_the_kernel_does() -> None:
    """Quoted values keep their spaces; a quoted whole word is one parameter; bare is boolean."""
    assert parse_params('a=1  b="x y" flag "c=d e"') == (
        ("a", "1"),
        ("b", "x y"),
        ("flag", None),
        ("c", "d e"),
    )


@pytest.mark.parametrize(
    ("text", "reason"),
    [
        ('a="x', "unbalanced double quote in 'a=\"x'"),
        ("--", "'--' would end parameter parsing"),
        ("=1", "'' is not a parameter name"),
        ("1a=2", "'1a' is not a parameter name"),
        ("a.b=1", "'a.b' is not a parameter name"),
        ("a=\t1", "contains the control or space character '\\t'"),
        ('a=b"c"', "double quotes must surround the value or the word in 'a=b\"c\"'"),
        ("a=" + "x" * 5000, "longer than 4096 bytes"),
    ],
)
def test_invalid_parameter_strings(text: str, reason: str) -> None:
    """Strings the kernel would split differently, or that smuggle controls, are refused."""
    with pytest.raises(ParamsError) as info:
        parse_params(text)
    assert str(info.value) == reason


def test_merge_lets_the_override_win_by_kernel_name() -> None:
    """Merging keeps order, and a later name replaces an earlier one ('-' equals '_')."""
    assert merge_params("a=1 b-c=2 d", "b_c=3 e") == "a=1 b_c=3 d e"


def test_stage_refuses_what_the_kernel_would_split_as_intake_does() -> None:
    """``à`` (UTF-8 C3 A0) unquoted carries byte 0xA0, a space to the kernel's ``next_arg``:
    ``parse_params`` (what ``stage`` runs) refuses it with intake's own words; quoted, or a
    character without that byte (``é``, C3 A9), it passes."""
    from service.verify.modfile.param_check import param_problems

    with pytest.raises(ParamsError, match=r"byte 0xA0 at offset 11 .* quote it"):
        parse_params("label=voil\u00e0")
    assert param_problems("label=voil\u00e0") == [
        "EINVAL (policy): byte 0xA0 at offset 11 (part of a UTF-8 character) is a space to the "
        "kernel's parameter parser and would split this value; quote it"
    ]
    assert parse_params('label="voil\u00e0"') == (("label", "voil\u00e0"),)
    assert parse_params("label=caf\u00e9") == (("label", "caf\u00e9"),)

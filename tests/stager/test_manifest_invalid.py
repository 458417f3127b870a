"""A catalogue of invalid manifests, each with the exact problems reported."""

from __future__ import annotations

import pytest

from stager.schema.failures import ManifestError
from stager.schema.manifest import Manifest

H = "0" * 64
HEAD = 'schema = 1\nbundle = "nvidia"\nversion = "580.95.05"\nkernel = "6.1.0-57-amd64"\n'
MOD = f'[[module]]\nfile = "modules/nvidia.ko"\nsha256 = "{H}"\n'

CASES: list[tuple[str, str, list[str]]] = [
    ("unknown top-level key", HEAD + "colour = 1\n" + MOD, ["colour: unknown key"]),
    ("unknown module key", HEAD + MOD + 'signer = "x"\n', ["module[0].signer: unknown key"]),
    (
        "unknown schema",
        HEAD.replace("schema = 1", "schema = 2") + MOD,
        ["schema: unknown schema 2 (this modstage reads schema 1)"],
    ),
    ("schema missing", HEAD.replace("schema = 1\n", "") + MOD, ["schema: missing"]),
    (
        "schema as string",
        HEAD.replace("schema = 1", 'schema = "1"') + MOD,
        ["schema: must be an integer, not a string"],
    ),
    (
        "version wrong type",
        HEAD.replace('version = "580.95.05"', "version = 580") + MOD,
        ["version: must be a string, not an integer"],
    ),
    ("kernel missing", HEAD.replace('kernel = "6.1.0-57-amd64"\n', "") + MOD, ["kernel: missing"]),
    ("no modules", HEAD, ["module: missing (a bundle loads at least one module)"]),
    (
        "empty module array",
        HEAD + "module = []\n",
        ["module: empty (a bundle loads at least one module)"],
    ),
    (
        "absolute path",
        HEAD + MOD.replace("modules/nvidia.ko", "/lib/modules/nvidia.ko"),
        ["module[0].file: '/lib/modules/nvidia.ko' is absolute"],
    ),
    (
        "dot-dot",
        HEAD + MOD.replace("modules/nvidia.ko", "modules/../../etc/nvidia.ko"),
        ["module[0].file: 'modules/../../etc/nvidia.ko' contains '..'"],
    ),
    ("empty file", HEAD + MOD.replace("modules/nvidia.ko", ""), ["module[0].file: is empty"]),
    (
        "not normalized",
        HEAD + MOD.replace("modules/nvidia.ko", "modules//nvidia.ko"),
        ["module[0].file: 'modules//nvidia.ko' is not normalized (empty or '.' component)"],
    ),
    (
        "not a module suffix",
        HEAD + MOD.replace("nvidia.ko", "nvidia.so"),
        ["module[0].file: 'modules/nvidia.so' does not end in .ko, .ko.xz, .ko.zst, .ko.gz"],
    ),
    (
        "duplicate file",
        HEAD + MOD + MOD,
        [
            "module[1].file: 'modules/nvidia.ko' is already listed as module[0].file",
            "module[1].file: module name 'nvidia' is already loaded by module[0]",
        ],
    ),
    (
        "same module name twice",
        HEAD + MOD + MOD.replace("modules/nvidia.ko", "other/nvidia.ko.xz"),
        ["module[1].file: module name 'nvidia' is already loaded by module[0]"],
    ),
    (
        "bundle not a safe identifier",
        HEAD.replace('"nvidia"', '"../nvidia"') + MOD,
        [
            "bundle: '../nvidia' is not a safe bundle name (lowercase letters, digits, '_' and '-', "
            "starting with a letter or digit, at most 63 characters)"
        ],
    ),
    (
        "bad sha256",
        HEAD + MOD.replace(H, "ABC"),
        ["module[0].sha256: must be 64 lowercase hexadecimal digits"],
    ),
    (
        "unbalanced quote in params",
        HEAD + MOD + 'params = "NVreg_X=\\"1"\n',
        [
            "module[0].params: not a kernel parameter string: unbalanced double quote in 'NVreg_X=\"1'"
        ],
    ),
    (
        "newline in params",
        HEAD + MOD + 'params = "a=1\\nb=2"\n',
        [
            "module[0].params: not a kernel parameter string: contains the control or space "
            "character '\\n'"
        ],
    ),
    (
        "params ends parsing",
        HEAD + MOD + 'params = "a=1 -- b=2"\n',
        ["module[0].params: not a kernel parameter string: '--' would end parameter parsing"],
    ),
    (
        "memory policy outside the set",
        HEAD + MOD + '[memory]\nauto_online_blocks = "online_fast"\n',
        [
            "memory.auto_online_blocks: 'online_fast' is not one of "
            "offline|online|online_kernel|online_movable"
        ],
    ),
    (
        "firmware outside firmware/",
        HEAD + MOD + f'[[firmware]]\nfile = "lib/gsp.bin"\nsha256 = "{H}"\n',
        ["firmware[0].file: 'lib/gsp.bin' is not under 'firmware/'"],
    ),
    (
        "after names itself",
        HEAD + 'after = ["nvidia"]\n' + MOD,
        ["after[0]: a bundle cannot load after itself"],
    ),
    (
        "module is not a table",
        HEAD + 'module = ["nvidia.ko"]\n',
        ["module[0]: must be a table, not a string"],
    ),
    ("not TOML", "schema = = 1", ["not valid TOML: Invalid value (at line 1, column 10)"]),
    (
        "several problems at once",
        HEAD.replace('version = "580.95.05"', 'version = ""')
        + "x = 1\n"
        + MOD.replace("modules/nvidia.ko", "/abs.ko"),
        [
            "x: unknown key",
            "version: '' is not a plain token (letters, digits, '.', '_', '+', "
            "'~', ':', '-'; at most 128)",
            "module[0].file: '/abs.ko' is absolute",
        ],
    ),
]


@pytest.mark.parametrize(("text", "expected"), [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_invalid_manifest_reports_exact_problems(text: str, expected: list[str]) -> None:
    """Each invalid manifest is rejected with exactly the listed problems, naming the key."""
    with pytest.raises(ManifestError) as info:
        Manifest.from_toml(text)
    assert list(info.value.problems) == expected


def test_non_utf8_bytes_are_rejected() -> None:
    """A manifest that is not UTF-8 is one problem, not a decoding traceback."""
    with pytest.raises(ManifestError) as info:
        Manifest.from_toml(HEAD.encode() + b"# \xff\n" + MOD.encode())
    offset = len(HEAD) + 2
    assert info.value.problems == (f"not UTF-8 (invalid start byte at byte {offset})",)


def test_oversized_manifest_is_rejected_before_parsing() -> None:
    """A manifest over 1 MiB is refused without being parsed."""
    with pytest.raises(ManifestError) as info:
        Manifest.from_toml(b"#" * (1 << 20) + b"\n")
    assert info.value.problems == ("larger than 1048576 bytes",)


def test_deeply_nested_toml_is_a_problem_not_a_crash() -> None:
    """Nesting deep enough to exhaust the parser's recursion is a reported problem."""
    text = "x = " + "[" * 100_000 + "]" * 100_000
    with pytest.raises(ManifestError) as info:
        Manifest.from_toml(text)
    assert len(info.value.problems) == 1

"""A module's ``.BTF`` as the kernel's module BTF parser begins to judge it.

``btf_problem`` mirrors ``btf_parse_hdr``, ``btf_check_sec_info`` and ``btf_parse_str_sec``
of Linux 6.1 (kernel/bpf/btf.c) for split BTF; the load rules refuse what it finds only on a
kernel that reads module BTF (``CONFIG_DEBUG_INFO_BTF_MODULES``) and lets no mismatch pass
(``CONFIG_MODULE_ALLOW_BTF_MISMATCH`` unset), as ``btf_module_notify`` does.
"""

from __future__ import annotations

import struct
import subprocess
from pathlib import Path

import pytest

from service.errors import ModuleRejected
from service.verify.loadrules import load_rules
from service.verify.modfile.btf import btf_problem
from service.verify.modfile.modinfo import ModInfo
from service.verify.targetkernel.kconfig import KernelConfig
from service.verify.targetkernel.kernel import Target


def header(**fields: int) -> bytes:
    """A BTF header (24 bytes), well formed for an empty split BTF unless ``fields`` say."""
    f = {"magic": 0xEB9F, "version": 1, "flags": 0, "hdr_len": 24, "type_off": 0,
         "type_len": 0, "str_off": 0, "str_len": 1, **fields}  # fmt: skip
    return struct.pack("<HBBIIIII", *f.values())


def problem(data: bytes) -> tuple[str, str] | None:
    return btf_problem(lambda at, n: data[at : at + n], len(data))


#: an empty split BTF: no types, one string (the empty one)
GOOD = header() + b"\0"


@pytest.mark.parametrize(
    ("data", "errno", "words"),
    [
        (GOOD[:7], "EINVAL", "hdr_len not found"),
        (header(hdr_len=64) + b"\0", "EINVAL", "btf_header not found"),
        (header(hdr_len=32, str_off=0) + b"\0" * 7 + b"\1" + b"\0", "E2BIG", "unsupported"),
        (header(magic=0x9FEB) + b"\0", "EINVAL", "invalid magic"),
        (header(version=2) + b"\0", "ENOTSUPP", "unsupported version"),
        (header(flags=1) + b"\0", "ENOTSUPP", "flags 0x1"),
        (header(str_off=2) + b"\0", "EINVAL", "invalid section offset"),
        (header(type_len=1, str_off=2) + b"\0\0\0", "EINVAL", "unsupported section"),
        (header(type_len=2, str_off=1, str_len=2) + b"\0\0\0", "EINVAL", "overlap"),
        (header(str_len=2) + b"\0", "EINVAL", "too long"),
        (header(type_len=1, str_off=1, str_len=0) + b"\0\0", "EINVAL", "unsupported section"),
        (header(type_off=1, type_len=1, str_off=0) + b"\0\0", "EINVAL", "not at the end"),
        (header() + b"x", "EINVAL", "invalid string section"),
    ],
)
def test_each_step_of_the_parser_refuses_what_it_refuses(
    data: bytes, errno: str, words: str
) -> None:
    """Each malformed header or layout gets the errno of the kernel's step that refuses it,
    in its words."""
    found = problem(data)
    assert found is not None and found[0] == errno and words in found[1], found


def test_a_well_formed_split_btf_passes() -> None:
    """An empty split BTF, one with a type section before its strings, one with no string
    section at all (split BTF may borrow every string from the kernel's) pass."""
    assert problem(GOOD) is None
    assert problem(header(type_len=4, str_off=4) + b"\1\2\3\4" + b"\0") is None
    assert problem(header(str_len=0)) is None
    assert problem(header(hdr_len=32) + b"\0" * 8 + b"\0") is None  # zeros past the header


def with_btf(ko: Path, btf: bytes, tmp_path: Path) -> bytes:
    """``ko`` with a ``.BTF`` section holding ``btf``, added as kbuild's pahole step would."""
    blob, out = tmp_path / "btf.bin", tmp_path / "with-btf.ko"
    blob.write_bytes(btf)
    subprocess.run(["objcopy", "--add-section", f".BTF={blob}", str(ko), str(out)], check=True)
    return out.read_bytes()


def target_for(data: bytes, config: str) -> Target:
    """A target of the module's own release, built with the ``config`` text."""
    vermagic = ModInfo.from_bytes(data).vermagic
    assert vermagic is not None
    return Target.from_spec(vermagic, KernelConfig.parse(config, "test"))


BTF_ON = "CONFIG_DEBUG_INFO_BTF_MODULES=y\n"


def test_a_kernel_without_btf_mismatch_allowed_refuses_a_broken_btf(
    modules: dict[str, Path], tmp_path: Path
) -> None:
    """A module whose .BTF has a wrong magic is refused EINVAL where the target reads
    module BTF and CONFIG_MODULE_ALLOW_BTF_MISMATCH is unset (sid's 7.2), and loads where it is
    set (Debian 12's 6.1, 13's 6.12) or where module BTF is not read; a well-formed .BTF loads on all three."""
    broken = with_btf(modules["ms_params"], header(magic=0x1234) + b"\0", tmp_path)
    strict = target_for(broken, BTF_ON + "# CONFIG_MODULE_ALLOW_BTF_MISMATCH is not set\n")
    with pytest.raises(ModuleRejected) as refused:
        load_rules(ModInfo.from_bytes(broken), strict)
    assert refused.value.refusal.errno == "EINVAL"
    assert "CONFIG_MODULE_ALLOW_BTF_MISMATCH is not set" in refused.value.reason
    for config in (BTF_ON + "CONFIG_MODULE_ALLOW_BTF_MISMATCH=y\n", "CONFIG_DEBUG_INFO_BTF=y\n"):
        assert load_rules(ModInfo.from_bytes(broken), target_for(broken, config)) is None
    good = with_btf(modules["ms_params"], GOOD, tmp_path)
    assert load_rules(ModInfo.from_bytes(good), strict) is None


def test_the_btf_of_the_kernel_s_own_modules_passes(kernel: str) -> None:
    """Every in-tree network driver of the host's kernel (Debian builds each with a .BTF)
    passes the parser's first checks: a module built as the kernel's own is never refused."""
    import lzma

    tree = Path("/lib/modules") / kernel / "kernel" / "drivers" / "net"
    files = sorted(tree.rglob("*.ko*"))[:60]
    assert files, tree
    for path in files:
        data = path.read_bytes()
        data = lzma.decompress(data) if path.suffix == ".xz" else data
        assert b".BTF\0" in data, path
        assert ModInfo.from_bytes(data).btf is None, path

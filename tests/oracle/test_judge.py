"""How the oracle compares modstage's verdicts with the kernel's errno."""

from __future__ import annotations

import errno
from pathlib import Path

from tests.kmod.build import kernel_release
from tests.oracle.cases import Case
from tests.oracle.judge import (
    AGREE_ACCEPT,
    AGREE_REFUSE,
    M_ACCEPT_K_REFUSE,
    MODULE_LISTS,
    POLICY,
    UNNAMED,
    Outcome,
    problems,
    table,
    target_root,
)


def outcome(ok: bool, reason: str, kernel: int, in_kernel: int | None = None) -> Outcome:
    """An Outcome in category `c`, from a verdict without `errno`/`policy` fields."""
    verdict = {"ok": ok, "reason": reason}
    result = {"errno": kernel, "in_kernel": in_kernel}
    return Outcome.of(Case("c/x", "c", "msorc_00001", b""), verdict, result)


def test_json_errno_and_policy_fields_win_over_the_reason_text() -> None:
    """`verify --json`'s `errno` and `policy` fields are used when present."""
    case = Case("c/x", "c", "msorc_00001", b"")
    named = Outcome.of(
        case, {"ok": False, "reason": "x", "errno": "EBADMSG", "policy": True}, {"errno": 0}
    )
    assert named.verdict == POLICY and named.errno_check is None
    claim = Outcome.of(
        case, {"ok": False, "reason": "x", "errno": "EKEYREJECTED", "policy": False}, {"errno": 129}
    )
    assert claim.errno_check is True


def test_a_refusal_by_the_modules_own_init_is_the_loaders_acceptance() -> None:
    """An errno returned after the kernel's `module_load` event (`init_called`: the real
    nvidia's ENODEV without a GPU) counts as the kernel accepting the module: modstage's
    acceptance agrees, a refusal without "policy" is unnamed, and a claimed errno is not
    checked against the init's. The same errno without the event is the loader's refusal."""
    case = Case("nvidia/signed", "nvidia", "nvidia", b"")
    after_init = {"errno": errno.ENODEV, "init_called": True}
    accepted = Outcome.of(case, {"ok": True, "reason": ""}, after_init)
    assert accepted.verdict == AGREE_ACCEPT and accepted.kernel_accepts
    assert accepted.kernel_text() == "loader accepted; its init returned ENODEV"
    refused = Outcome.of(case, {"ok": False, "reason": "ENODEV: x"}, after_init)
    assert refused.verdict == UNNAMED and refused.errno_check is None
    by_loader = Outcome.of(case, {"ok": True, "reason": ""}, {"errno": errno.ENODEV})
    assert by_loader.verdict == M_ACCEPT_K_REFUSE and not by_loader.kernel_accepts


def test_verdict_columns() -> None:
    """Accepts and refusals land in the right column; a refusal of a loadable module is
    fine only when it says "policy"."""
    assert outcome(True, "", 0).verdict == AGREE_ACCEPT
    assert outcome(True, "", errno.ENOEXEC).verdict == M_ACCEPT_K_REFUSE
    assert outcome(False, "ENOEXEC: x", errno.ENOEXEC).verdict == AGREE_REFUSE
    assert outcome(False, "ENOPKG: SHA-1 refused by policy", 0).verdict == POLICY
    assert outcome(False, "EBADMSG: trailing bytes", 0).verdict == UNNAMED


def test_errno_claims_are_seen_through_enforcement() -> None:
    """ENOKEY/ENOPKG/ENODATA claims match the kernel's EKEYREJECTED under enforcement;
    another errno is a mismatch; a policy refusal claims nothing."""
    assert outcome(False, "ENOKEY: no key", errno.EKEYREJECTED).errno_check is True
    assert outcome(False, "EBADMSG: bad", errno.EKEYREJECTED).errno_check is False
    assert outcome(False, "ENOPKG: policy", errno.EKEYREJECTED).errno_check is None
    assert outcome(False, "no errno here", errno.EKEYREJECTED).errno_check is None


def test_compressed_refusal_may_name_the_in_kernel_route() -> None:
    """A refusal naming EOPNOTSUPP (no in-kernel decompression) agrees with that route even
    though the decompressed module loads."""
    case = outcome(False, "EOPNOTSUPP: no CONFIG_MODULE_DECOMPRESS", 0, errno.EOPNOTSUPP)
    assert case.verdict == AGREE_REFUSE and case.errno_check is True
    assert outcome(False, "ENOTSUP: same", 0, errno.EOPNOTSUPP).errno_check is True


def test_problems_and_table_name_every_broken_rule() -> None:
    """problems() lists exactly the rule breakers; the table counts them per column."""
    cases = [
        outcome(True, "", 0),
        outcome(True, "", errno.EBADMSG),
        outcome(False, "EBADMSG: x", 0),
        outcome(False, "EINVAL: x", errno.EBADMSG),
        outcome(False, "ENOPKG: policy", 0),
    ]
    found = problems(cases)
    assert len(found) == 3
    assert "kernel EBADMSG" in found[0]
    text = table(cases)
    assert text.splitlines()[1].split()[1:] == ["1", "1", "1", "1", "1", "0/1"]


def test_minimal_target_root_is_a_node_without_headers(tmp_path: Path) -> None:
    """The minimal root holds the kernel image and config, the in-tree module tree (the
    host's, through a symlink) and the module lists, and no build/; with `symvers` it adds
    build/Module.symvers only."""
    release = kernel_release()
    host = Path("/lib/modules", release)
    modules = target_root(tmp_path / "minimal", release) / "lib/modules" / release
    assert sorted(p.name for p in modules.iterdir()) == sorted(("kernel", *MODULE_LISTS))
    assert (modules / "kernel").resolve() == (host / "kernel").resolve()
    assert (modules / "kernel/lib/crc-itu-t.ko").is_file()
    for listing in MODULE_LISTS:
        assert (modules / listing).read_bytes() == (host / listing).read_bytes()
    boot = tmp_path / "minimal/boot"
    assert sorted(p.name for p in boot.iterdir()) == [f"config-{release}", f"vmlinuz-{release}"]
    assert (boot / f"vmlinuz-{release}").read_bytes()[:2] == b"MZ"  # the bzImage itself
    full = target_root(tmp_path / "symvers", release, symvers=True) / "lib/modules" / release
    assert [p.name for p in (full / "build").iterdir()] == ["Module.symvers"]

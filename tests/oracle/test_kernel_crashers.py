"""Modules that crash the target kernel instead of being refused must be refused by modstage."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.kmod.build import kernel_release
from tests.oracle import elf
from tests.oracle.judge import REPO, target_root, trusted_dir
from tests.oracle.module import base_module, renamed
from tests.oracle.pki import load_pki
from tests.oracle.testbed import sign_file


def _verify(module: Path, root: Path, trusted: Path, release: str) -> dict[str, object]:
    argv = [sys.executable, "-m", "service.cli", "verify", "--json", "--kernel", release]
    argv += ["--root", str(root), "--trusted", str(trusted), str(module)]
    proc = subprocess.run(argv, capture_output=True, text=True, cwd=REPO, check=False)
    verdict: dict[str, object] = json.loads(proc.stdout)[0]
    return verdict


@pytest.mark.parametrize("symvers", [False, True], ids=["no headers", "with Module.symvers"])
def test_modstage_refuses_a_this_module_shorter_than_struct_module(
    tmp_path: Path, symvers: bool
) -> None:
    """6.1 oopses in add_kallsyms on a signed module whose .gnu.linkonce.this_module is
    shorter than struct module (tests/vm/test_oracle.py proves it); modstage must refuse it
    with every source of the target's exports, as a named safety policy on 6.1 (the kernel
    gives no errno: it crashes), while the same module unshortened is accepted."""
    pki, release = load_pki(), kernel_release()
    root = target_root(tmp_path / "root", release, symvers=symvers)
    trusted = trusted_dir(pki, tmp_path / "trusted")
    whole = renamed(base_module(), 1)
    sign_file(whole, pki.ca, tmp_path / "whole.ko")
    control = _verify(tmp_path / "whole.ko", root, trusted, release)
    assert control["ok"], control
    payload = elf.set_section(whole, ".gnu.linkonce.this_module", size=0x100)
    module = tmp_path / "short.ko"
    sign_file(payload, pki.ca, module)
    verdict = _verify(module, root, trusted, release)
    assert not verdict["ok"] and verdict["policy"], verdict
    assert str(verdict["reason"]).startswith("ENOEXEC (policy): safety: ")
    assert "256 bytes, not sizeof(struct module) = 896" in str(verdict["reason"])

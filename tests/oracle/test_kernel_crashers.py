"""Modules that crash the target kernel instead of being refused must be refused by modstage."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from tests.kmod.build import kernel_release
from tests.oracle import elf
from tests.oracle.judge import REPO, target_root, trusted_dir
from tests.oracle.module import base_module, renamed
from tests.oracle.pki import load_pki
from tests.oracle.testbed import sign_file


def test_modstage_refuses_a_this_module_shorter_than_struct_module(tmp_path: Path) -> None:
    """6.1 oopses in add_kallsyms on a signed module whose .gnu.linkonce.this_module is
    shorter than struct module (tests/vm/test_oracle.py proves it); modstage must refuse it."""
    pki, release = load_pki(), kernel_release()
    payload = elf.set_section(renamed(base_module(), 1), ".gnu.linkonce.this_module", size=0x100)
    module = tmp_path / "short.ko"
    sign_file(payload, pki.ca, module)
    argv = [sys.executable, "-m", "service.cli", "verify", "--json", "--kernel", release]
    argv += ["--root", str(target_root(tmp_path / "root", release))]
    argv += ["--trusted", str(trusted_dir(pki, tmp_path / "trusted")), str(module)]
    proc = subprocess.run(argv, capture_output=True, text=True, cwd=REPO, check=False)
    verdict = json.loads(proc.stdout)[0]
    assert not verdict["ok"], verdict

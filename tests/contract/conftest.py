"""What every in-process run of the contract shares: the module files and a sysfs tree."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.contract.cases import contract_files
from tests.kmod import build_modules


@pytest.fixture(scope="module")
def files(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """The test modules and a renamed copy, built once."""
    return contract_files(build_modules(), tmp_path_factory.mktemp("contract"))


def contract_sys(sys: Path) -> Path:
    """A sysfs tree as the VM's node has it: two online and two offline memory blocks,
    ``auto_online_blocks`` offline, an empty ``firmware_class.path``, no modules."""
    memory = sys / "devices/system/memory"
    for n, state in {0: "online", 1: "online", 2: "offline", 3: "offline"}.items():
        (memory / f"memory{n}").mkdir(parents=True)
        (memory / f"memory{n}/state").write_text(state + "\n")
    (memory / "auto_online_blocks").write_text("offline\n")
    firmware = sys / "module/firmware_class/parameters"
    firmware.mkdir(parents=True)
    (firmware / "path").write_text("\n")
    return sys

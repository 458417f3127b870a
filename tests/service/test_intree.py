"""The target kernel's own modules are read from its tree: the files under ``kernel/`` and
``modules.dep``'s ``kernel/`` lines, never its out-of-tree ``updates/`` or ``extra/``.

Plain directory trees under ``tmp_path``, then the installed Debian kernel's real tree.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from service.verify.targetkernel.intree import in_tree_modules, module_of


def _files(tree: Path, *paths: str) -> Path:
    for path in paths:
        (tree / path).parent.mkdir(parents=True, exist_ok=True)
        (tree / path).write_bytes(b"")
    return tree


@pytest.mark.parametrize(
    ("path", "name"),
    [
        ("kernel/lib/crc8.ko", "crc8"),
        ("kernel/lib/crc-itu-t.ko.xz", "crc_itu_t"),
        ("kernel/drivers/nvme/host/nvme.ko.zst", "nvme"),
        ("mlx5_core.ko.gz", "mlx5_core"),
        ("kernel/lib/crc8.kobj", None),
        ("kernel/lib/.ko", None),
        ("kernel/lib/modules.order", None),
    ],
)
def test_a_module_file_is_named_as_the_kernel_compares_it(path: str, name: str | None) -> None:
    """``<stem>.ko`` and ``<stem>.ko.<ext>`` are module ``<stem>`` with ``_`` for ``-``; any
    other file is none."""
    assert module_of(path) == name


def test_the_files_under_kernel_and_the_kernel_lines_of_modules_dep_are_in_tree(
    tmp_path: Path,
) -> None:
    """Every ``*.ko*`` under ``kernel/`` and each ``kernel/`` line of ``modules.dep`` (an
    absolute one too, as old depmods wrote) is in-tree, with its path below the tree; the
    ``updates/`` and ``extra/`` modules modules.dep also lists, and their files, are not."""
    tree = _files(
        tmp_path / "6.1.0-57-amd64",
        "kernel/lib/crc8.ko",
        "kernel/drivers/net/bonding/bonding.ko.xz",
        "updates/dkms/nvidia.ko",
        "extra/zfs.ko",
    )
    (tree / "modules.dep").write_text(
        "kernel/lib/crc8.ko:\n"
        "kernel/drivers/nvme/host/nvme-core.ko: kernel/lib/crc8.ko\n"
        f"{tree}/kernel/net/sctp/sctp.ko:\n"
        "updates/dkms/nvidia.ko:\n"
        "extra/zfs.ko: kernel/lib/crc8.ko\n"
    )
    assert in_tree_modules(tree) == {
        "crc8": "kernel/lib/crc8.ko",
        "bonding": "kernel/drivers/net/bonding/bonding.ko.xz",
        "nvme_core": "kernel/drivers/nvme/host/nvme-core.ko",
        "sctp": "kernel/net/sctp/sctp.ko",
    }


def test_a_tree_without_modules_or_modules_dep_has_none(tmp_path: Path) -> None:
    """A missing tree, or one with neither ``kernel/`` nor ``modules.dep``, names nothing
    (intake waits for a missing tree before it asks)."""
    assert in_tree_modules(tmp_path / "absent") == {}
    assert in_tree_modules(_files(tmp_path / "tree", "updates/x.ko")) == {}


def test_the_installed_kernels_tree_names_its_own_modules(kernel: str) -> None:
    """Debian's installed tree: the module of every ``kernel/`` line of its ``modules.dep``
    is in-tree, ``crc8``, ``nvme`` and ``bonding`` among them."""
    tree = Path("/lib/modules") / kernel
    found = in_tree_modules(tree)
    lines = (tree / "modules.dep").read_text().splitlines()
    listed = {module_of(line.partition(":")[0]) for line in lines if line.startswith("kernel/")}
    assert listed <= found.keys() and len(listed) > 1000
    assert {"crc8", "nvme", "bonding"} <= found.keys()

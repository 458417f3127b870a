"""A state disk: an ext4 image on the host that the guest mounts at /var/lib/modstage.

The state share (9p) writes through to the host's page cache, which outlives qemu, so killing
qemu loses nothing the guest wrote, fsynced or not. A virtio disk opened with `cache=none`
(O_DIRECT on the host) behaves like a disk: what the guest wrote back is in the image, what
still sits in the guest's page cache dies with qemu. The guest mounts it with a long journal
commit interval (`STATE_DISK_MOUNT`): no timer makes a change durable during a test, only an
fsync does, so a missing fsync is a lost change rather than a lucky one.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

from .errors import VmSetupError

STATE_DISK_MOUNT = "commit=600"
DEFAULT_SIZE = 512 << 20


def make_ext4_image(path: Path, size: int = DEFAULT_SIZE, label: str = "modstage-state") -> Path:
    """Create an empty ext4 image of `size` bytes at `path` (sparse; package e2fsprogs)."""
    mkfs = shutil.which("mkfs.ext4") or "/usr/sbin/mkfs.ext4"
    if not Path(mkfs).exists():
        raise VmSetupError("mkfs.ext4 is missing; install e2fsprogs")
    with open(path, "wb") as f:
        f.truncate(size)
    # Inode tables and journal written now, so the guest's ext4lazyinit does no I/O of its own.
    options = "lazy_itable_init=0,lazy_journal_init=0"
    done = subprocess.run(
        [mkfs, "-q", "-F", "-m", "0", "-L", label, "-E", options, str(path)],
        capture_output=True,
        text=True,
        check=False,
    )
    if done.returncode != 0:
        raise VmSetupError(f"mkfs.ext4 {path} failed: {done.stderr.strip()}")
    return path


def cache_mode(image: Path) -> str:
    """qemu's cache mode for `image`: `none` (O_DIRECT), or `writeback` where the host's file
    system refuses O_DIRECT (tmpfs before 6.6). Either way a write qemu made is in the host's
    file once qemu is killed; only the guest's own page cache is lost."""
    try:
        fd = os.open(image, os.O_RDONLY | os.O_DIRECT)
    except OSError:
        return "writeback"
    os.close(fd)
    return "none"

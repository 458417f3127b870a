"""What is unsafe about the trusted-certificate directory itself (``trusted.d``).

Every key whose certificate lies there may sign modules the host loads, so the directory
must be the admin's alone, and it must hold certificates only: a private key there (a
kernel's ``signing_key.pem`` holds key and certificate) lets whoever reads it sign modules
this host trusts. ``config check`` and ``status`` name each problem; nothing is refused for
it (the certificates still load).
"""

from __future__ import annotations

import stat
from pathlib import Path

MAX_READ = 1 << 20  # a certificate file is small; a larger one is not read for keys


def trust_dir_problems(directory: Path) -> list[str]:
    """Each unsafe thing about ``directory`` and its files, one line each (empty: none)."""
    try:
        mode = directory.stat().st_mode
        entries = sorted(directory.iterdir())
    except OSError:
        return []  # unreadable or absent: the trust store's own error says so
    problems = []
    if mode & stat.S_IWOTH:
        problems.append(f"{directory}: world-writable: anyone can add a key this host trusts")
    for path in entries:
        try:
            st = path.stat()
        except OSError:
            continue
        if not stat.S_ISREG(st.st_mode):
            continue
        if st.st_mode & stat.S_IWOTH:
            problems.append(f"{path}: world-writable: anyone can replace a trusted certificate")
        if st.st_size <= MAX_READ and _holds_private_key(path):
            readable = ", world-readable" if st.st_mode & stat.S_IROTH else ""
            problems.append(
                f"{path}: holds a private key{readable}: trusted.d needs the certificate "
                "alone (whoever reads the key can sign modules this host loads)"
            )
    return problems


def _holds_private_key(path: Path) -> bool:
    """Whether the file holds a PEM private key (``-----BEGIN … PRIVATE KEY-----``)."""
    try:
        data = path.read_bytes()
    except OSError:
        return False
    return b"PRIVATE KEY-----" in data

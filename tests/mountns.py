"""Run a command in a private mount namespace whose host directories are overlays.

Each :class:`Overlay` puts extra files over a real directory (``/usr/bin``, ``/etc``,
``/var/lib``, ``/run``) and, with ``upper``, catches every write the command makes there
instead of letting it reach the machine. After the run, an empty ``upper`` proves the
command changed nothing in that directory. Needs root and ``unshare``/overlayfs (a CI
machine has both); a namespace that cannot be set up fails the test loudly.
"""

from __future__ import annotations

import shlex
import subprocess
from dataclasses import dataclass
from pathlib import Path

SETUP_FAILED = 97


@dataclass(frozen=True)
class Overlay:
    """``extra`` files shown over ``target``; writes into ``target`` land in ``upper``."""

    target: str
    extra: Path | None = None
    upper: Path | None = None

    def mount(self) -> str:
        """The shell line that mounts this overlay (exit 97 if it cannot)."""
        lower = f"{self.extra}:{self.target}" if self.extra else self.target
        options = f"lowerdir={lower}"
        if self.upper is not None:
            (self.upper / "u").mkdir(parents=True, exist_ok=True)
            (self.upper / "w").mkdir(parents=True, exist_ok=True)
            options += f",upperdir={self.upper / 'u'},workdir={self.upper / 'w'}"
        return (
            f"mount -t overlay overlay -o {shlex.quote(options)} {shlex.quote(self.target)}"
            f" || exit {SETUP_FAILED}"
        )

    def written(self) -> list[str]:
        """Paths the command created or changed under ``target`` (relative)."""
        if self.upper is None:
            return []
        base = self.upper / "u"
        return sorted(str(p.relative_to(base)) for p in base.rglob("*"))


def run(
    argv: list[str],
    overlays: list[Overlay],
    *,
    nsenter: bool = False,
    env: dict[str, str] | None = None,
    timeout: float = 120,
) -> subprocess.CompletedProcess[str]:
    """Run ``argv`` in a fresh mount namespace with ``overlays`` mounted.

    With ``nsenter``, ``argv`` runs as kured runs its sentinel command:
    ``/usr/bin/nsenter -m/proc/PID/ns/mnt -- ARGV``, PID being the namespace's first
    process (the sandbox's stand-in for the host's PID 1).
    """
    launch = 'exec /usr/bin/nsenter -m/proc/$$/ns/mnt -- "$@"' if nsenter else 'exec "$@"'
    script = "\n".join([*(o.mount() for o in overlays), launch])
    done = subprocess.run(
        ["unshare", "--mount", "--propagation", "private", "sh", "-c", script, "sh", *argv],
        capture_output=True,
        text=True,
        env=env,
        timeout=timeout,
        check=False,
    )
    assert done.returncode != SETUP_FAILED, f"cannot set up the mount namespace: {done.stderr}"
    assert "unshare: " not in done.stderr, f"unshare failed: {done.stderr}"
    return done

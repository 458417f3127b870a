"""The reboot backends, one registry: what each is called and how it asks for a reboot.

``[reboot] backend`` names one of :data:`BACKENDS`; the config validates against it,
:func:`service.rebooting.request.rebooter` builds from it, and status reads its properties. A new
backend is one entry here (and, only when it asks in a way none of the kinds below
does, a rebooter class in :mod:`service.rebooting.request`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from service.layout import Layout, kernel_image

# ([reboot] command, layout, the release the next boot runs): the commands to run
Commands = Callable[[tuple[str, ...], Layout, str], list[list[str]]]
# (layout, the release the next boot runs): why the backend cannot reboot this host, or None
Check = Callable[[Layout, str], str | None]


@dataclass(frozen=True)
class Backend:
    """One way of asking for a reboot.

    A backend writes kured's sentinel (``sentinel``), runs ``commands`` (given the
    config's ``command``, the layout and the kernel release the next boot runs, evaluated
    when the reboot is asked), or
    neither: then it never reboots and an admin does (``admin_reboots``).
    """

    name: str
    summary: str
    sentinel: bool = False
    commands: Commands | None = None
    needs_command: bool = False  # [reboot] command must be a non-empty argv
    check: Check | None = None  # asked by ``config check`` and before each request

    @property
    def admin_reboots(self) -> bool:
        """Nothing asks for the reboot: status says it is required and an admin reboots."""
        return not self.sentinel and self.commands is None


def _kexec(_: tuple[str, ...], layout: Layout, release: str) -> list[list[str]]:
    """``kexec -s``: kexec_file_load, the one lockdown permits (it checks the image's
    signature), of the kernel the next boot runs (a kernel update's, not the running one
    again), then systemd's kexec."""
    boot = layout.root / "boot"
    initrd = f"--initrd={boot / f'initrd.img-{release}'}"
    image = kernel_image(layout, release)  # /boot's, else the module tree's vmlinuz
    load = ["kexec", "-s", "-l", str(image), initrd, "--reuse-cmdline"]
    return [load, ["systemctl", "kexec"]]


def _kexec_problem(layout: Layout, release: str) -> str | None:
    """Under lockdown the kernel loads only a signed image for kexec: say so before trying
    (of ``release``, the kernel the next boot runs)."""
    try:
        mode = layout.lockdown.read_text()
    except OSError:
        return None  # no lockdown LSM: kexec_file_load checks nothing more
    if "[none]" in mode or "[" not in mode:
        return None
    image = kernel_image(layout, release)
    signed = authenticode_signed(image)
    if signed:
        return None
    what = "cannot be read" if signed is None else "carries no Authenticode signature"
    return (
        f"kexec under lockdown ({mode.strip()}): the kernel loads only a signed image, "
        f"and {image} {what}; use backend systemd or kured"
    )


def authenticode_signed(image: Path) -> bool | None:
    """Whether the PE image (an EFI-stub bzImage) has a certificate table (None: unreadable
    or not PE); what shim and kexec_file_load verify lives there."""
    try:
        with open(image, "rb") as f:
            head = f.read(4096)
    except OSError:
        return None
    if len(head) < 64 or head[:2] != b"MZ":
        return None
    pe = int.from_bytes(head[0x3C:0x40], "little")
    optional = pe + 24
    if head[pe : pe + 4] != b"PE\0\0" or len(head) < optional + 112 + 5 * 8:
        return None
    magic = int.from_bytes(head[optional : optional + 2], "little")
    directories = optional + (112 if magic == 0x20B else 96)
    count = int.from_bytes(head[directories - 4 : directories], "little")
    size = int.from_bytes(head[directories + 4 * 8 + 4 : directories + 5 * 8], "little")
    return count > 4 and size > 0


BACKENDS = {
    b.name: b
    for b in (
        Backend("kured", "write kured's sentinel: kured drains and reboots in its window", True),
        Backend(
            "systemd", "systemctl reboot", commands=lambda _, __, ___: [["systemctl", "reboot"]]
        ),
        Backend(
            "kexec",
            "kexec -s -l the kernel the next boot runs, then systemctl kexec",
            commands=_kexec,
            check=_kexec_problem,
        ),
        Backend(
            "command",
            "run [reboot] command",
            commands=lambda argv, _, __: [list(argv)],
            needs_command=True,
        ),
        Backend("none", "never reboot: status says a reboot is required, an admin reboots"),
    )
}


def admin_reboots(name: str | None) -> bool:
    """Whether backend ``name`` leaves the reboot to an admin (False if unknown)."""
    found = BACKENDS.get(name or "")
    return found is not None and found.admin_reboots

"""The reboot backends, one registry: what each is called and how it asks for a reboot.

``[reboot] backend`` names one of :data:`BACKENDS`; the config validates against it,
:func:`service.reboot.rebooter` builds from it, and status reads its properties. A new
backend is one entry here (and, only when it asks in a way none of the kinds below
does, a rebooter class in :mod:`service.reboot`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from service.layout import Layout

Commands = Callable[[tuple[str, ...], Layout], list[list[str]]]  # ([reboot] command, layout)


@dataclass(frozen=True)
class Backend:
    """One way of asking for a reboot.

    A backend writes kured's sentinel (``sentinel``), runs ``commands`` (given the
    config's ``command`` and the layout, evaluated when the reboot is asked), or
    neither: then it never reboots and an admin does (``admin_reboots``).
    """

    name: str
    summary: str
    sentinel: bool = False
    commands: Commands | None = None
    needs_command: bool = False  # [reboot] command must be a non-empty argv

    @property
    def admin_reboots(self) -> bool:
        """Nothing asks for the reboot: status says it is required and an admin reboots."""
        return not self.sentinel and self.commands is None


def _kexec(_: tuple[str, ...], layout: Layout) -> list[list[str]]:
    release = layout.kernel_release()
    boot = layout.root / "boot"
    initrd = f"--initrd={boot / f'initrd.img-{release}'}"
    load = ["kexec", "-l", str(boot / f"vmlinuz-{release}"), initrd, "--reuse-cmdline"]
    return [load, ["systemctl", "kexec"]]


BACKENDS = {
    b.name: b
    for b in (
        Backend("kured", "write kured's sentinel: kured drains and reboots in its window", True),
        Backend("systemd", "systemctl reboot", commands=lambda _, __: [["systemctl", "reboot"]]),
        Backend("kexec", "kexec -l the running kernel, then systemctl kexec", commands=_kexec),
        Backend(
            "command",
            "run [reboot] command",
            commands=lambda argv, _: [list(argv)],
            needs_command=True,
        ),
        Backend("none", "never reboot: status says a reboot is required, an admin reboots"),
    )
}


def admin_reboots(name: str | None) -> bool:
    """Whether backend ``name`` leaves the reboot to an admin (False if unknown)."""
    found = BACKENDS.get(name or "")
    return found is not None and found.admin_reboots

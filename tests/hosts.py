"""One factory for the running host's facts under a test root: :func:`running_host`.

Tests do not write ``proc/sys/kernel/osrelease`` or ``proc/sys/kernel/random/boot_id`` by
hand: they ask for a host with a kernel release, a boot id and live modules, or without
one of them (None: the file is absent, as on a root whose procfs cannot be read), or
change one fact of a host they built (:data:`KEEP` leaves the other as it is).
"""

from __future__ import annotations

import enum
from collections.abc import Iterable
from pathlib import Path

from service.layout import Layout


class _Keep(enum.Enum):
    KEEP = "keep"


#: leave this fact's file as it is (a kernel changed, the boot id kept, or the reverse)
KEEP = _Keep.KEEP

#: the kernel release and the boot id a host gets unless a test asks for others
RELEASE = "6.1.0-test"
BOOT_ID = "11111111-2222-3333-4444-555555555555"


def running_host(
    root: Path | Layout,
    release: str | _Keep | None = RELEASE,
    boot_id: str | _Keep | None = BOOT_ID,
    *,
    live: Iterable[str] = (),
) -> Layout:
    """The layout over ``root`` with the running kernel's ``release`` and this boot's
    ``boot_id`` written where procfs shows them (each replaced if it was there, removed if
    None, left alone if :data:`KEEP`) and each module of ``live`` shown live under
    ``sys/module`` (``initstate``)."""
    layout = root if isinstance(root, Layout) else Layout(root)
    for path, text in ((layout.os_release, release), (layout.boot_id, boot_id)):
        if text is KEEP:
            continue
        if text is None:
            path.unlink(missing_ok=True)
            continue
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(f"{text.strip()}\n")
    for name in live:
        module = layout.sys / "module" / name
        module.mkdir(parents=True, exist_ok=True)
        (module / "initstate").write_text("live\n")
    return layout

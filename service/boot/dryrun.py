"""``modstage boot --dry-run``: the next boot, run with nothing made real.

The dry run is :class:`~service.boot.loader.Boot` itself, given a kernel that records its
calls (:class:`~service.host.recording.RecordingKernel`, reading the live modules from
``/sys``), a sysfs and a firmware view that record their writes, and a
:class:`~service.boot.persist.Recorded` persistence that writes nothing and takes no lock.
Every decision is the boot's own (which generation, the ``after`` order, modules already
loaded, another version already loaded, ``depends=`` loaded with modprobe, verification,
fallback to the last known good), so the plan printed is the one the boot follows. The
recording kernel answers as the kernel would where the files tell (a live name, a missing
dependency, a ``modprobe`` name the module tree lacks); what the kernel itself would refuse
at load (a signature it does not trust, an init that fails) is not known before it is asked;
for a bundle whose modules have PCI aliases the plan says which present devices they match
and who drives them now (an init that returns ENODEV without one leaves it ``no_device``).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, TextIO

from service.boot.loader import Boot, summary
from service.boot.persist import Recorded
from service.bundles.phase import Phase
from service.bundles.state import State
from service.config import Config
from service.host import pci
from service.host.firmware import PATH_PARAM, RecordingFirmwareView
from service.host.pci import PciDevice
from service.host.recording import Identify, RecordingKernel
from service.host.running import RunningHost
from service.host.sysfs import RecordingSysfs, Sysfs
from service.layout import Layout, modules_dir

if TYPE_CHECKING:
    from service.verify.signature.trust import TrustStore

Event = tuple[str, ...]

#: What leads every line a dry run prints: none of it was done.
PREVIEW = "preview: "


@dataclass(frozen=True)
class DryRun:
    """What the boot would do, in the order it would do it, and the state it would reach."""

    events: tuple[Event, ...]
    state: State
    failed: tuple[str, ...] = field(default=())  # bundles that would end failed
    release: str = ""  # the running kernel it was decided for


def dry_run(
    layout: Layout,
    config: Config,
    trust: TrustStore | Callable[[], TrustStore],
    identify: Identify,
    running: RunningHost | None = None,
) -> DryRun:
    """Run the boot on ``layout`` with every effect recorded; nothing is written.
    ``running``: the host's facts as the command read them (None: read here)."""
    events: list[Event] = []
    sysfs = RecordingSysfs(layout.sys, events)
    firmware = RecordingFirmwareView(
        layout.run / "firmware", sysfs, events, allow_foreign=config.allow_foreign_firmware_path
    )
    running = running if running is not None else RunningHost.read(layout)
    modules = modules_dir(layout, running.need_release())  # what modprobe would find
    kernel = RecordingKernel(layout.sys, calls=events, identify=identify, modules=modules)
    boot = Boot(
        layout,
        config,
        trust,
        kernel,
        sysfs,
        persist=Recorded(layout, events),
        firmware=firmware,
        running=running,
    )
    state = boot.run()
    failed = tuple(n for n, b in sorted(state.bundles.items()) if b.phase is Phase.FAILED)
    return DryRun(tuple(events), state, failed, running.need_release())


def render(run: DryRun, layout: Layout, out: TextIO) -> None:
    """Print :func:`plan`, every line led by :data:`PREVIEW`."""
    for line in plan(run, layout):
        print(f"{PREVIEW}{line}", file=out)


def plan(run: DryRun, layout: Layout) -> Iterator[str]:
    """The recorded boot as an admin reads it: each step under the bundle it belongs to,
    then the boot's own last lines (:func:`~service.boot.loader.summary`), each followed
    by the present devices the bundle's modules match."""
    release = run.release
    yield f"nothing is loaded, written or rebooted (kernel {release})"
    if not run.state.bundles:
        yield "no bundles"
    step = 0
    for kind, *rest in run.events:
        if kind == "state":
            name, phase, note = rest
            yield f"{name}: would be {phase}{f' ({note})' if note else ''}"
            step = 0
            continue
        if kind == "remove":
            yield f"remove {rest[0]} (the previous boot's metrics)"
            continue
        step += 1
        if kind == "finit_module":
            path, params = rest
            file = path.rsplit("/", 2)
            shown = "/".join(file[-2:]) if len(file) > 1 else path
            yield f"   {step}) finit_module {shown}{f' {params}' if params else ''}"
        elif kind == "modprobe":
            yield f"   {step}) modprobe {' '.join(rest)}"
        elif kind == "delete_module":
            yield f"   {step}) delete_module {rest[0]} (undoing this attempt)"
        elif kind == "write":
            attribute, value = rest
            shown = "(cleared)" if value == "\0" else value
            what = PATH_PARAM if attribute == PATH_PARAM else attribute
            yield f"   {step}) write {what} = {shown}"
        elif kind == "link":
            yield f"   {step}) link firmware {rest[0]}"
        elif kind == "unlink":
            yield f"   {step}) unlink the firmware of {rest[0]}"
    present: tuple[PciDevice, ...] | None = None
    bundles = sorted(run.state.bundles.items())
    for (_, b), line in zip(bundles, summary(run.state, release), strict=True):
        yield line
        aliases = {m.module: m.pci for m in b.loaded if m.pci}
        if aliases:
            present = present if present is not None else pci.present(Sysfs(layout.sys))
            found = pci.devices_for(aliases, present, [m.module for m in b.loaded])
            yield f"   devices now: {found.summary()}"

"""``modstage boot --dry-run``: the next boot, run with nothing made real.

The dry run is :class:`~service.boot.loader.Boot` itself, given a kernel that records its
calls (:class:`~service.kernel.recording.RecordingKernel`, reading the live modules from
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

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, TextIO

from service.boot.loader import Boot
from service.boot.persist import Recorded
from service.config import Config
from service.kernel import pci
from service.kernel.firmware import PATH_PARAM, RecordingFirmwareView
from service.kernel.pci import PciDevice
from service.kernel.recording import Identify, RecordingKernel
from service.kernel.sysfs import RecordingSysfs, Sysfs
from service.layout import Layout
from service.store.state import State

if TYPE_CHECKING:
    from service.verify.signature.trust import TrustStore

Event = tuple[str, ...]


@dataclass(frozen=True)
class DryRun:
    """What the boot would do, in the order it would do it, and the state it would reach."""

    events: tuple[Event, ...]
    state: State
    failed: tuple[str, ...] = field(default=())  # bundles that would end failed


def dry_run(
    layout: Layout,
    config: Config,
    trust: TrustStore | Callable[[], TrustStore],
    identify: Identify,
) -> DryRun:
    """Run the boot on ``layout`` with every effect recorded; nothing is written."""
    events: list[Event] = []
    sysfs = RecordingSysfs(layout.sys, events)
    firmware = RecordingFirmwareView(
        layout.run / "firmware", sysfs, events, allow_foreign=config.allow_foreign_firmware_path
    )
    modules = layout.modules_dir(layout.kernel_release())  # what modprobe would find
    kernel = RecordingKernel(layout.sys, calls=events, identify=identify, modules=modules)
    boot = Boot(
        layout, config, trust, kernel, sysfs, persist=Recorded(layout, events), firmware=firmware
    )
    state = boot.run()
    failed = tuple(n for n, b in sorted(state.bundles.items()) if b.phase.value == "failed")
    return DryRun(tuple(events), state, failed)


def render(run: DryRun, layout: Layout, out: TextIO) -> None:
    """The recorded boot as an admin reads it: each step under the bundle it belongs to."""
    release = layout.kernel_release()
    print(f"dry run: nothing is loaded, written or rebooted (kernel {release})", file=out)
    if not run.state.bundles:
        print("no bundles", file=out)
    step = 0
    for kind, *rest in run.events:
        if kind == "state":
            name, phase, note = rest
            print(f"{name}: would be {phase}{f' ({note})' if note else ''}", file=out)
            step = 0
            continue
        step += 1
        if kind == "finit_module":
            path, params = rest
            file = path.rsplit("/", 2)
            shown = "/".join(file[-2:]) if len(file) > 1 else path
            print(f"   {step}) finit_module {shown}{f' {params}' if params else ''}", file=out)
        elif kind == "modprobe":
            print(f"   {step}) modprobe {' '.join(rest)}", file=out)
        elif kind == "delete_module":
            print(f"   {step}) delete_module {rest[0]} (undoing this attempt)", file=out)
        elif kind == "write":
            attribute, value = rest
            shown = "(cleared)" if value == "\0" else value
            what = PATH_PARAM if attribute == PATH_PARAM else attribute
            print(f"   {step}) write {what} = {shown}", file=out)
        elif kind == "link":
            print(f"   {step}) link firmware {rest[0]}", file=out)
        elif kind == "unlink":
            print(f"   {step}) unlink the firmware of {rest[0]}", file=out)
    present: tuple[PciDevice, ...] | None = None
    for name, b in sorted(run.state.bundles.items()):
        print(
            f"=> {name}: {b.phase.value} (active {b.active or '-'}, pending {b.pending or '-'})",
            file=out,
        )
        aliases = {m.module: m.pci for m in b.loaded if m.pci}
        if aliases:
            present = present if present is not None else pci.present(Sysfs(layout.sys))
            found = pci.devices_for(aliases, present, [m.module for m in b.loaded])
            print(f"   devices now: {found.summary()}", file=out)

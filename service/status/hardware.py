"""What ``status`` shows of the node's hardware: memory blocks (and those in the wrong zone
for the policy), and the PCI devices a bundle's loaded modules are for and who drives them.
The device view is read only for a bundle with PCI aliases. (Signers: ``signers.py``.)"""

from __future__ import annotations

from collections import Counter
from pathlib import Path

from service.bundles.state import BundleState, State
from service.config import Config
from service.generations.store import Store
from service.host import pci
from service.host.memory import misplaced, walk
from service.host.sysfs import Sysfs
from service.layout import Layout
from service.status.health import Health
from service.status.report import DeviceRow, DevicesRow, MemoryRow, Problem
from stager.schema.manifest import MemoryPolicy


def devices_row(devices: pci.Devices | None) -> DevicesRow | None:
    if devices is None:
        return None
    rows = tuple(
        DeviceRow(d.address, d.ids, d.modalias, d.driver, d.module, d.module in devices.modules)
        for d in devices.devices
    )
    return DevicesRow(len(rows), len(devices.bound), devices.summary(), rows)


class PciView:
    """The node's PCI devices, read once per ``status`` and only if a bundle needs them."""

    def __init__(self, sys_root: Path) -> None:
        self.sys_root = sys_root
        self._present: tuple[pci.PciDevice, ...] | None = None

    def for_bundle(self, b: BundleState | None) -> pci.Devices | None:
        """The devices the bundle's loaded modules are for (None: none has a PCI alias)."""
        aliases = {m.module: m.pci for m in b.loaded if m.pci} if b else {}
        if not aliases:
            return None
        if self._present is None:
            self._present = pci.present(Sysfs(self.sys_root))
        return pci.devices_for(aliases, self._present, [m.module for m in b.loaded] if b else ())


def memory_summary(sys_root: Path) -> tuple[MemoryRow, ...]:
    """Memory blocks counted by NUMA node, zone (online blocks only) and state."""
    counts: Counter[tuple[int | None, str | None, str]] = Counter()
    for block in walk(Sysfs(sys_root), detail=True):
        counts[(block.node, block.zone, block.state)] += 1
    return tuple(
        MemoryRow(n, z, s, c)
        for (n, z, s), c in sorted(
            counts.items(),
            key=lambda kv: (kv[0][0] is None, kv[0][0] or 0, kv[0][2], kv[0][1] or ""),
        )
    )


def misplaced_memory(layout: Layout, state: State, config: Config | None) -> list[Problem]:
    """Hot-added blocks online in a zone the host's or an active bundle's policy rules out
    (the kernel onlined them before the policy was set, and they could not be moved)."""
    policies: dict[MemoryPolicy, str] = {}
    if config is not None and config.hotplug_policy != "kernel":
        policies[MemoryPolicy(config.hotplug_policy)] = "the host's hotplug_policy"
    store = Store(layout.store)
    for name, b in sorted(state.bundles.items()):
        try:
            policy = store.manifest(b.active).memory if b.active else None
        except (OSError, ValueError):
            continue  # the bundle's own report says what is wrong with its generation
        if policy is not None:
            policies.setdefault(policy, f"bundle {name}'s memory policy")
    problems = []
    sysfs = Sysfs(layout.sys)
    for policy, whose in policies.items():
        found = misplaced(sysfs, policy)
        if found:
            where = ", ".join(f"memory{b.number} ({b.zone})" for b in found)
            problems.append(
                Problem(
                    None,
                    Health.DEGRADED,
                    f"hot-added memory outside the zone {whose} ({policy.value}) asks for,"
                    f" onlined before the policy was set and not movable: {where}",
                )
            )
    return problems

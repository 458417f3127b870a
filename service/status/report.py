"""The ``status`` document as typed records; JSON only at the edge (:meth:`Report.to_json`).

:func:`service.status.collect.collect` builds a :class:`Report`; the views and the
metrics read its fields. ``to_json`` gives ``status --json`` (schema 1 in
``docs/status.md``) through :func:`stager.schema.record.dump`: key for key what it always printed.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from service.bundles.records import RebootIntent
from service.host.installed import InstalledKernel
from service.host.nextboot import NextKernel
from service.publish.quarantine import Record
from service.status.glance import Heartbeat
from service.status.health import Health
from service.status.live import LiveModule
from stager.schema.record import dump, spec
from stager.schema.statusfile import StatusFile

SCHEMA = 1


@dataclass(frozen=True)
class GenerationRow:
    """One generation of a bundle as status shows it; ``role`` is what it is to the bundle."""

    id: str
    version: str
    kernel: str
    added: float
    added_utc: str | None
    attempts: int
    failed: str | None
    role: str
    roles: tuple[str, ...]  # every role: active, last-known-good, pending, failed, retained


@dataclass(frozen=True)
class LoadedRow:
    """One module of the active generation: as recorded at load, and as the kernel has it."""

    module: str
    srcversion: str | None
    ms: float | None
    already_loaded: bool
    live: LiveModule | None = field(metadata=spec(dump=lambda m: _live(m)))


def _live(now: LiveModule | None) -> dict[str, Any] | None:
    """The kernel's view of a loaded module (``loaded[].live``), without its name."""
    return (
        None if now is None else {k: getattr(now, k) for k in ("srcversion", "version", "refcnt")}
    )


@dataclass(frozen=True)
class HistoryRow:
    """One recorded move of a bundle (an admin's verb has ``from_ == to``)."""

    at: float | None
    at_utc: str | None
    from_: str | None = field(metadata=spec(key="from"))
    to: str | None
    note: str | None


_LABEL = spec(dump=lambda health: health.label)


@dataclass(frozen=True)
class DeviceRow:
    """One present PCI device the bundle's loaded modules are for, and who drives it."""

    address: str
    ids: str  # vendor:device
    modalias: str
    driver: str | None  # None: no driver is bound
    module: str | None  # the module of that driver (None: built in, or unbound)
    ours: bool  # a module of this bundle drives it


@dataclass(frozen=True)
class DevicesRow:
    """The present devices the bundle's loaded modules are for (``devices``)."""

    present: int
    bound: int  # how many of them a module of the bundle drives
    summary: str  # "2 of 2 devices bound", or who has the others
    devices: tuple[DeviceRow, ...]


@dataclass(frozen=True)
class SignerRow:
    """Who signed one module of the active or pending generation, and which of the running
    kernel's keyrings holds that key: ``builtin``, ``machine`` (MOK), ``secondary``,
    ``platform`` (UEFI db), or None when none does (``note`` says why it is unknown).

    ``key_id`` is the id the kernel searches for (serial || issuer, or the SKID); ``signer``
    the kernel's name for the key (``"Example GPU vendor: 7aeac1f5…"``: the subject and the
    SKID, else the serial; from ``certificate`` when one is known, else from the signature);
    ``loaded`` the kernel's verdict on a live module of the active generation (``verified``,
    or ``unverified``: loaded without a trusted signature, ``E`` in its ``taint``)."""

    generation: str
    file: str
    key_id: str | None
    keyring: str | None
    note: str | None = None
    version: str | None = None  # the generation's version
    signer: str | None = None
    issuer: str | None = None  # the whole issuer name (RFC 4514), when known
    serial: str | None = None  # hex, when known
    skid: str | None = None  # hex, when known
    certificate: str | None = None  # a trusted certificate's path, "kernel keyring", or None
    taint: str | None = None  # /sys/module/<name>/taint of a live module
    loaded: str | None = None  # "verified" | "unverified" | None: not live, or unknown
    # the in-tree module of the generation's kernel this one takes the name of (its path in
    # that kernel's module tree; a bundle's ``shadow_in_tree`` allowed it), None: none
    shadows: str | None = None


@dataclass(frozen=True)
class SignerLine:
    """One signer of one generation as both views show it: the modules it signed, whether a
    kernel keyring holds its key, and what the kernel made of the live ones."""

    generation: str
    version: str | None
    signer: str | None  # None: unsigned, or unknown (``trust`` says why)
    issuer: str | None
    files: tuple[str, ...]
    trust: str  # "trusted by .machine", "trusted by no keyring", or why it is unknown
    loaded: str | None  # "loaded unverified (kernel tainted)", per module when they differ


@dataclass(frozen=True)
class UpgradingRow:
    """A bundle without its driver for a planned upgrade (``upgrading``): what it waits
    for, since when, and when that becomes a failure (``expired``: it has)."""

    to: str | None  # the pending generation (None: the new driver pod's drop is not in yet)
    version: str | None
    since_utc: str | None
    unload_seen: bool  # ``since`` is the unload the daemon saw (else the pending's record)
    seconds: float  # without the driver for (at least) this long
    limit_seconds: float
    fails_at_utc: str | None
    expired: bool


@dataclass(frozen=True)
class BundleReport:
    """One bundle: persisted state, health and its reasons, and its last status file."""

    phase: str
    health: Health = field(metadata=_LABEL)
    reasons: tuple[str, ...]
    active: str | None
    pending: str | None
    last_known_good: str | None
    held: bool
    waiting: str | None
    generations: tuple[GenerationRow, ...]
    loaded: tuple[LoadedRow, ...]
    history: tuple[HistoryRow, ...]
    status_file: StatusFile | None
    errors: tuple[str, ...]
    # None: no loaded module of the bundle has a PCI alias
    devices: DevicesRow | None = None
    signers: tuple[SignerRow, ...] = ()
    upgrading: UpgradingRow | None = None
    # each reason's own health (``problems`` carry it; not a key of the bundle's JSON)
    grades: tuple[Health, ...] = field(default=(), metadata=spec(omit=lambda _: True))


@dataclass(frozen=True)
class Problem:
    """One reason the host or a bundle (``bundle``; None: the host) is not healthy."""

    bundle: str | None
    health: Health = field(metadata=_LABEL)
    reason: str


@dataclass(frozen=True)
class WindowRow:
    """The configured reboot window (times as ``HH:MM:SS``)."""

    days: tuple[str, ...]
    start: str
    end: str
    timezone: str


@dataclass(frozen=True)
class RebootReport:
    """Whether a reboot is required, asked for, and why not yet (``reboot``)."""

    required: bool
    bundles: tuple[str, ...]
    scheduled: tuple[str, ...]
    asked: RebootIntent | None
    backend: str | None
    window: WindowRow | None
    next_window: str | None
    window_open: bool
    why_not_asked: str
    sentinel: str = field(metadata=spec(key="sentinel.path"))
    sentinel_present: bool = field(metadata=spec(key="sentinel.present"))
    # why ``status --reboot-required`` cannot tell (it exits 3); None: it can
    unknown: str | None = None
    # the next boot's kernel when it is another than the running one
    next_kernel: str | None = None
    # bundles with an active generation and none for the next kernel: without a driver there
    driverless: tuple[str, ...] = ()
    # each of them with its cover: waiting, refused, held or none (service.bundles.cover)
    covers: Mapping[str, str] = field(default_factory=dict)
    # a wanted reboot waits for them (``--reboot-required`` exits 4) until ``hold_until``
    held: bool = False
    hold_until: str | None = None
    gate: str | None = None  # what the gate says (the line kured logs when it holds)


@dataclass(frozen=True)
class MemoryRow:
    """Memory blocks of one NUMA node (None: unknown), zone (online only) and state."""

    node: int | None
    zone: str | None
    state: str
    blocks: int


@dataclass(frozen=True)
class Report:
    """Everything ``modstage status`` shows about the host."""

    health: Health = field(metadata=_LABEL)
    kernel: str | None
    boot_id: str | None
    generated_utc: str | None
    state_path: str = field(metadata=spec(key="state.path"))
    state_error: str | None = field(metadata=spec(key="state.error"))
    state_boot_id: str | None = field(metadata=spec(key="state.boot_id"))
    config_path: str = field(metadata=spec(key="config.path"))
    config_error: str | None = field(metadata=spec(key="config.error"))
    daemon: Heartbeat
    reboot: RebootReport
    problems: tuple[Problem, ...]
    bundles: Mapping[str, BundleReport]
    memory: tuple[MemoryRow, ...]
    quarantine: tuple[Record, ...]
    # the kernel the next boot runs and how that was decided; the installed kernels
    next_kernel: NextKernel | None = None
    kernels: tuple[InstalledKernel, ...] = ()
    # kernel.modules_disabled: True once module loading is locked until the reboot; None:
    # unreadable
    modules_locked: bool | None = None

    @property
    def exit_code(self) -> int:
        """``status``'s exit code: 0 healthy, 1 degraded, 2 failed, 4 upgrading."""
        return self.health.code

    def to_json(self) -> dict[str, Any]:
        """The ``status --json`` document (schema :data:`SCHEMA`)."""
        return {"schema": SCHEMA, "exit_code": self.exit_code, **dump(self)}

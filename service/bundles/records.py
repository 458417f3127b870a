"""The typed records ``state.json`` keeps beside the phase machine.

Each record is a frozen dataclass; :func:`stager.schema.record.dump` gives its persisted form
and :func:`stager.schema.record.load` reads it back, refusing anything unexpected with every
problem named by its key, so a hand-edited or damaged file fails where it is read,
never later with a KeyError.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from stager.schema.record import is_empty, is_none, spec


@dataclass(frozen=True)
class HistoryEntry:
    """One recorded move of a bundle, or an admin's act (``source`` is ``target``)."""

    at: float
    source: str = field(metadata=spec(key="from"))  # the phase moved from (a Phase value)
    target: str = field(metadata=spec(key="to"))  # the phase moved to
    note: str = field(default="", metadata=spec(omit=is_empty))


@dataclass(frozen=True)
class ModuleLoad:
    """What boot did with one module of a generation it brought up."""

    module: str  # the kernel's (normalized) module name
    srcversion: str | None
    # how long finit_module took (absent when already loaded)
    ms: float | None = field(default=None, metadata=spec(omit=is_none))
    # the same build was live already: not loaded again (present only when true)
    already_loaded: bool = field(default=False, metadata=spec(omit=is_empty))
    # the module's ``alias=pci:...`` patterns: the devices it is for (absent when none)
    pci: tuple[str, ...] = field(default=(), metadata=spec(omit=is_empty))


@dataclass(frozen=True)
class RebootIntent:
    """The daemon's recorded request for a reboot: when, in which boot, how, for whom."""

    at: float  # wall time of the request
    boot_id: str | None  # the boot it was asked in (a later boot id: it happened)
    backend: str | None = None
    bundles: tuple[str, ...] = ()
    reason: str | None = None


@dataclass(frozen=True)
class RefusedDrop:
    """A drop intake refused after the driver it would replace had left the kernel.

    The driver pod that made it is taken to be the one deployed (an operator's new pod
    unloads the old driver before its container drops): the active generation is loaded
    again at the next boot and the digest this drop carried is published, so that pod's
    init container keeps it. Recorded until a drop of the bundle is accepted.
    """

    at: float  # wall time of the refusal
    reason: str  # the first reason, without the drop's path
    version: str | None = field(default=None, metadata=spec(omit=is_none))  # its manifest's
    generation: str | None = field(default=None, metadata=spec(omit=is_none))  # the id it had
    digest: str | None = field(default=None, metadata=spec(omit=is_none))  # config digest

    def same_drop(self, other: RefusedDrop) -> bool:
        """Whether ``other`` is this drop again (the same manifest and digest), refused later."""
        return (self.version, self.generation, self.digest) == (
            other.version,
            other.generation,
            other.digest,
        )


@dataclass(frozen=True)
class AdminChoice:
    """The generation an admin made pending (``rollback`` or ``retry``), as long as it is.

    A drop does not replace a pending rollback (an admin's reaction to a bad driver: the
    container re-dropping that driver would undo it); it replaces a pending retry, and the
    new pending generation's history note says so (:meth:`BundleState.staged`). A retry
    keeps what it cleared (``failed``, ``rolled_back``): undoing it (``rollback`` to the
    active generation, :func:`service.bundles.verbs.cancel`) records them again.
    """

    verb: str  # "rollback" or "retry"
    generation: str  # the id it made pending
    what: str  # how it is named: "rollback to 3f2a... (1.0)"
    # a retry's: the failure and the rollback mark it cleared, given back if it is undone
    failed: str | None = field(default=None, metadata=spec(omit=is_none))
    rolled_back: str | None = field(default=None, metadata=spec(omit=is_none))

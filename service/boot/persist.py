"""Where a boot's decisions go: durably to disk, or into a record (``boot --dry-run``).

:class:`~service.boot.loader.Boot` makes every decision the same way whichever it is given;
:class:`Durable` is a real boot's (the state lock, ``state.json`` and the status files
through the one crash-safe write, the digest files, the status mirrors), :class:`Recorded`
writes nothing and keeps each transition in order, so a dry run is the boot itself.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any, Protocol

from service.bundles.state import BundleState, State
from service.config import Config
from service.generations.store import Store
from service.layout import Layout


class Persist(Protocol):
    """What a boot writes, one method each."""

    def locked(self) -> contextlib.AbstractContextManager[None]:
        """Hold the state lock for the whole boot."""

    def load(self, store: Store) -> State:
        """The state the boot starts from."""

    def save(self, state: State, step: str) -> None:
        """Persist ``state`` (``step``: the transition, for the crash tests)."""

    def status(self, name: str, bundle: BundleState, **status: Any) -> None:
        """Publish ``bundle``'s status file."""

    def publish_digest(self, name: str, bundle: BundleState) -> None:
        """A generation of bundle ``name`` went live: write its digest file (the digest of
        :meth:`~service.bundles.state.BundleState.digest_generation`)."""

    def mirror(self, state: State) -> None:
        """Publish ``state`` (the saved one) to the node labels and the status mirrors."""


class Durable:
    """A real boot's writes."""

    def __init__(self, layout: Layout, config: Config) -> None:
        self.layout, self.config = layout, config

    def locked(self) -> contextlib.AbstractContextManager[None]:
        """The state lock (``<var>/.lock``)."""
        from service.bundles.statefile import locked

        return locked(self.layout.var)

    def load(self, store: Store) -> State:
        """``state.json``, rebuilt from the store when it is corrupt."""
        from service.bundles.recover import load_or_rebuild

        return load_or_rebuild(self.layout.state, store)

    def save(self, state: State, step: str) -> None:
        """``state.json`` through the crash-safe write."""
        from service.bundles.statefile import save

        save(self.layout.state, state, step=step)

    def status(self, name: str, bundle: BundleState, **status: Any) -> None:
        """``status/<name>.json``."""
        from service.publish.bundle_status import write_status

        write_status(self.layout, name, bundle, **status)

    def publish_digest(self, name: str, bundle: BundleState) -> None:
        """The bundle's digest file, if the config names one."""
        from service.publish.operator import publish_digest

        publish_digest(self.layout, self.config, name, bundle)

    def mirror(self, state: State) -> None:
        """The node labels and the status mirrors the config names."""
        from service.publish.operator import mirror_status

        mirror_status(self.layout, self.config, state)


class Recorded:
    """Writes nothing; ``events`` gets each transition (``("state", bundle, phase, note)``)."""

    def __init__(self, layout: Layout, events: list[tuple[str, ...]]) -> None:
        self.layout, self.events = layout, events

    @contextlib.contextmanager
    def locked(self) -> Iterator[None]:
        """No lock: nothing is written, and a running boot may hold it."""
        yield

    def load(self, store: Store) -> State:
        """The state the boot would start from: a corrupt ``state.json`` rebuilt from the
        last-good pointer and the store, as :meth:`Durable.load` does, with nothing moved
        aside nor saved."""
        from service.bundles.recover import load_or_rebuild

        return load_or_rebuild(self.layout.state, store, durable=False)

    def save(self, state: State, step: str) -> None:
        """Nothing is saved: the transitions are recorded by :meth:`status`."""

    def status(self, name: str, bundle: BundleState, **status: Any) -> None:
        """Record the bundle's new phase and why."""
        errors = status.get("errors") or ()
        note = "; ".join(errors) if errors else bundle.history[-1].note if bundle.history else ""
        self.events.append(("state", name, bundle.phase.value, note))

    def publish_digest(self, name: str, bundle: BundleState) -> None:
        """Nothing is written."""

    def mirror(self, state: State) -> None:
        """Nothing is written."""

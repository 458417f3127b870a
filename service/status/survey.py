"""What an admin (or a monitor) needs to know, read without a daemon, but for who signed
each module.

:func:`survey` reads ``state.json``, the status files, the host config and sysfs, and
returns the :class:`~service.status.report.Report` that ``status`` shows (``--json``:
:meth:`Report.to_json`, schema in ``docs/status.md``). Who signed each module is read only
through the ``signers`` it is given: :func:`service.status.collect.collect` gives
:func:`~service.status.signer_rows.signer_rows` (the verify stack's certificate and signature
parsers), the daemon's metrics give none, so the daemon never imports ``service.verify``.
Whether a bundle is healthy is decided in :mod:`service.status.health` from plain values;
nothing here writes anything, so a corrupt state file is reported, not moved aside.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from dataclasses import replace
from datetime import UTC, datetime
from pathlib import Path

from service.bundles.phase import Phase
from service.bundles.records import HistoryEntry, ModuleLoad
from service.bundles.state import BundleState, State
from service.bundles.statefile import read
from service.config import Config
from service.errors import ConfigError, HostFactUnreadable, NotRoot, StateError
from service.host import pci
from service.host.installed import installed
from service.host.nextboot import decide, read_grub
from service.host.running import RunningHost
from service.layout import Layout
from service.publish import quarantine
from service.publish.operator import bundle_status_files
from service.rebooting.config import RebootConfig
from service.rebooting.request import sentinel_path
from service.rebooting.window import Window
from service.status import required
from service.status.glance import Heartbeat, iso, read_heartbeat, why_no_reboot
from service.status.hardware import (
    PciView,
    devices_row,
    memory_summary,
    misplaced_memory,
)
from service.status.health import Grade, Health, bundle_health, overall, waiting_note
from service.status.live import LiveModule, live_modules
from service.status.report import (
    BundleReport,
    GenerationRow,
    HistoryRow,
    LoadedRow,
    Problem,
    RebootReport,
    Report,
    SignerRow,
    UpgradingRow,
    WindowRow,
)
from service.status.trustdir import trust_dir_problems
from service.status.unloads import read_unloads
from service.status.upgrade import DRIVER_POD_READY, Unloads, Upgrading
from stager.schema.statusfile import StatusFile, StatusFileError

#: Who signed each module of a bundle's active and pending generations (one row a module).
SignerRows = Callable[[Layout, BundleState | None], tuple[SignerRow, ...]]


def read_state(path: Path) -> State:
    """``state.read`` with I/O errors as :class:`StateError` (status reports, never moves)."""
    try:
        return read(path)  # its StateError names the path already
    except PermissionError as exc:
        raise NotRoot(path) from exc
    except OSError as exc:
        raise StateError(f"{path}: cannot read: {exc.strerror}") from exc


def _kernel(running: RunningHost) -> tuple[str | None, list[Problem]]:
    """The running kernel's release, or a degraded problem naming the file and why it could
    not be read (as ``status --reboot-required`` names it): nothing is checked against a
    kernel status cannot name."""
    try:
        return running.need_release(), []
    except HostFactUnreadable as exc:
        why = (
            f"{exc}: the running kernel is unknown: no generation is checked against it, "
            "and whether a reboot is required cannot be told"
        )
        return None, [Problem(None, Health.DEGRADED, why)]


def read_status_files(directory: Path) -> dict[str, StatusFile | str]:
    """Every ``<bundle>.json`` status file by bundle: its contents, or why it is garbled."""
    docs: dict[str, StatusFile | str] = {}
    for path in bundle_status_files(directory):
        try:
            docs[path.stem] = StatusFile.from_json(path.read_bytes(), path)
        except OSError as exc:
            docs[path.stem] = f"status file {path} is garbled ({exc}): the last outcome is unknown"
        except StatusFileError as exc:
            why = f"status file {path} is garbled ({exc.reason})"
            docs[path.stem] = f"{why}: the last outcome is unknown"
    return docs


def roles(bundle: BundleState, generation: str) -> tuple[str, ...]:
    """Every role a generation has in its bundle: active, last-known-good, pending, failed
    (retained when none)."""
    gen = bundle.generations[generation]
    found = [
        role
        for role, holds in (
            ("active", generation == bundle.active),
            ("last-known-good", generation == bundle.last_known_good),
            ("pending", generation == bundle.pending),
            ("failed", bool(gen.failed)),
        )
        if holds
    ]
    return tuple(found) or ("retained",)


def generation_rows(b: BundleState) -> tuple[GenerationRow, ...]:
    """The bundle's generations, oldest first, each with its role (the first of active,
    pending, failed, retained) and every role: the one record ``status --json`` and
    ``generations --json`` print."""
    main = {b.active: "active", b.pending: "pending"}
    return tuple(
        GenerationRow(
            id=g.id,
            version=g.version,
            kernel=g.kernel,
            added=g.added,
            added_utc=iso(g.added),
            attempts=g.attempts,
            failed=g.failed,
            role=main.get(g.id) or ("failed" if g.failed else "retained"),
            roles=roles(b, g.id),
        )
        for g in sorted(b.generations.values(), key=lambda g: g.added)
    )


def _loaded_row(m: ModuleLoad, live: Mapping[str, LiveModule | None]) -> LoadedRow:
    """One module of the load record, beside what the kernel has now."""
    return LoadedRow(m.module, m.srcversion, m.ms, m.already_loaded, live.get(m.module))


def _history_row(h: HistoryEntry) -> HistoryRow:
    """One recorded move, with its time in UTC."""
    return HistoryRow(h.at, iso(h.at), h.source, h.target, h.note or None)


def _upgrading_row(up: Upgrading | None) -> UpgradingRow | None:
    if up is None:
        return None
    return UpgradingRow(
        up.to,
        up.version,
        iso(up.since),
        up.unload_seen,
        round(up.seconds, 1),
        up.limit,
        iso(up.since + up.limit),
        up.expired,
    )


def _bundle_report(
    bundle: BundleState | None,
    status_doc: StatusFile | None,
    verdict: Grade,
    *,
    kernel: str | None,
    live: Mapping[str, LiveModule | None],
    devices: pci.Devices | None = None,
    signers: tuple[SignerRow, ...] = (),
) -> BundleReport:
    """One bundle; a bundle known only from its status file takes the file's phase."""
    b = bundle if bundle is not None else BundleState()
    generations = generation_rows(b)
    errors = status_doc.errors if status_doc is not None else ()
    errors += tuple(f"{g.id[:12]}: {g.failed}" for g in generations if g.failed)
    only_file = bundle is None and status_doc is not None
    return BundleReport(
        phase=status_doc.phase if only_file and status_doc else b.phase.value,
        health=verdict.health,
        reasons=verdict.reasons,
        active=b.active,
        pending=b.pending,
        last_known_good=b.last_known_good,
        held=b.held,
        waiting=waiting_note(b, kernel),
        generations=generations,
        loaded=tuple(_loaded_row(m, live) for m in b.loaded),
        history=tuple(_history_row(h) for h in b.history),
        status_file=status_doc,
        errors=errors,
        devices=devices_row(devices),
        signers=signers,
        upgrading=_upgrading_row(verdict.upgrading),
        grades=verdict.grades,
    )


def unloads(layout: Layout, config: Config | None, boot_id: str | None, now: float) -> Unloads:
    """What the host knows of its modules' unloads (the daemon's record, the operator's
    readiness file) and the upgrading bound of ``config`` (the defaults' when invalid)."""
    ready = layout.host(DRIVER_POD_READY)
    return Unloads(
        read_unloads(layout.unloads, boot_id),
        ready.exists() if ready.parent.is_dir() else None,
        now,
        (config.reboot if config is not None else RebootConfig()).upgrading_limit(),
    )


def _bundles(
    layout: Layout,
    state: State,
    kernel: str | None,
    boot_id: str | None,
    known: Unloads,
    signers: SignerRows | None,
) -> dict[str, BundleReport]:
    """Every bundle that state or a status file names, judged against the running kernel."""
    files = read_status_files(layout.status)
    bundles: dict[str, BundleReport] = {}
    view = PciView(layout.sys)
    for name in sorted(set(state.bundles) | set(files)):
        b, entry = state.bundles.get(name), files.get(name)
        doc = entry if isinstance(entry, StatusFile) else None
        live = live_modules(layout.sys, [m.module for m in b.loaded] if b else [])
        devices = view.for_bundle(b)
        verdict = bundle_health(
            b,
            doc,
            kernel=kernel,
            boot_id=boot_id,
            state_boot_id=state.boot_id,
            live=live,
            devices=devices,
            unloads=known,
        )
        if isinstance(entry, str):
            verdict = Grade(
                max(verdict.health, Health.DEGRADED),
                (*verdict.reasons, entry),
                verdict.upgrading,
                (*verdict.grades, Health.DEGRADED),
            )
        rows = signers(layout, b) if signers is not None else ()
        bundles[name] = _bundle_report(
            b, doc, verdict, kernel=kernel, live=live, devices=devices, signers=rows
        )
    return bundles


def _state(layout: Layout) -> tuple[State, str | None, list[Problem]]:
    """The state, its error, and host problems (a corrupt file set aside, then rebuilt)."""
    try:
        state, error = read_state(layout.state), None
    except StateError as exc:
        return State(), str(exc), [Problem(None, Health.FAILED, str(exc))]
    aside = sorted(layout.state.parent.glob(f"{layout.state.name}.corrupt-*"))
    if not aside:
        return state, error, []
    if not layout.state.exists():
        error = (
            f"{layout.state} is missing: an earlier state file was corrupt and is set aside "
            f"at {aside[-1]}; the next boot rebuilds the last known good from the store"
        )
        return state, error, [Problem(None, Health.FAILED, error)]
    why = (
        f"{layout.state} was rebuilt after it was found corrupt; the corrupt file is kept "
        f"at {aside[-1]}: inspect it, then remove it"
    )
    return state, error, [Problem(None, Health.DEGRADED, why)]


def _config(layout: Layout) -> tuple[Config | None, str | None]:
    try:
        return Config.load(layout.config), None
    except ConfigError as exc:
        return None, f"{exc}: the daemon and intake refuse to start; boot uses defaults"


def _configured_next(layout: Layout, config: Config | None) -> str | None:
    """``[kernel] next``; from an invalid config, the value if that key itself is valid."""
    chosen = config if config is not None else Config.salvage(layout.config)[0]
    return chosen.kernel.next


def _window_row(window: Window | None) -> WindowRow | None:
    if window is None:
        return None
    return WindowRow(
        tuple(window.days), window.start.isoformat(), window.end.isoformat(), window.timezone
    )


def _reboot(
    layout: Layout,
    state: State,
    config: Config | None,
    kernel: str | None,
    bundles: Mapping[str, BundleReport],
    daemon: Heartbeat,
    now: float,
    boot_id: str | None,
) -> RebootReport:
    sentinel = layout.reboot_sentinel
    if config is not None:
        sentinel = sentinel_path(config.reboot, layout)
    waiting = state.awaiting_reboot(kernel or "")
    # a request of an earlier boot is over (the daemon clears it when it next starts):
    # never shown as current, as --reboot-required never counts it
    asked = state.intent_in(boot_id) if boot_id is not None else state.reboot
    moment = datetime.fromtimestamp(now, UTC)
    window = config.reboot.window if config is not None else None
    opens = window.next_open(moment) if window is not None else None
    backend = config.reboot.backend if config is not None else None
    why = why_no_reboot(
        required=bool(waiting),
        asked=asked,
        backend=backend,
        daemon=daemon,
        opens=opens,
        now=moment,
        waits=[f"{n}: {b.waiting}" for n, b in bundles.items() if b.waiting],
    )
    report = RebootReport(
        required=bool(waiting),
        bundles=tuple(waiting),
        scheduled=tuple(
            n for n, b in sorted(state.bundles.items()) if b.phase is Phase.REBOOT_SCHEDULED
        ),
        asked=asked,  # the daemon's recorded request in this boot: at, boot_id, backend, ...
        backend=backend,
        window=_window_row(window),
        next_window=iso(opens.timestamp()) if opens is not None else None,
        window_open=opens is not None and opens <= moment,
        why_not_asked=why,
        sentinel=str(sentinel),
        sentinel_present=sentinel.exists(),
    )
    return _with_answer(report, required.answer(layout))  # the sentinel command's own


def _with_answer(report: RebootReport, answer: required.Answer) -> RebootReport:
    """``report`` with what ``status --reboot-required`` decided, shown as it is: why it
    cannot tell, and the next kernel's gate."""
    gate = answer.gate
    if gate is None:
        return replace(report, unknown=answer.unknown)
    return replace(
        report,
        unknown=answer.unknown,
        next_kernel=gate.kernel,
        driverless=gate.bundles,
        covers=dict(gate.covers),
        held=answer.held,
        hold_until=iso(gate.until),
        gate=gate.line(),
    )


def survey(
    layout: Layout, *, now: float | None = None, signers: SignerRows | None = None
) -> Report:
    """What ``status`` shows of the host under ``layout`` (``now``: epoch seconds), each
    bundle's signers read by ``signers`` (None: no signer rows; nothing else differs)."""
    now = time.time() if now is None else now
    running = RunningHost.read(layout)
    kernel, kernel_problems = _kernel(running)
    boot_id = running.boot_id  # None: unreadable; the reboot line then says why
    state, state_error, state_problems = _state(layout)
    config, config_error = _config(layout)
    known = unloads(layout, config, boot_id, now)
    bundles = _bundles(layout, state, kernel, boot_id, known, signers)
    locked = _modules_locked(layout)
    before = [*kernel_problems, *state_problems]
    if config_error:
        before.append(Problem(None, Health.DEGRADED, config_error))
    after = [*misplaced_memory(layout, state, config), *_guard_problems(layout, config, locked)]
    healths = [p.health for p in (*before, *after)] + [b.health for b in bundles.values()]
    problems = (*before, *_bundle_problems(bundles), *after)
    daemon = read_heartbeat(layout.heartbeat, now)
    kernels = installed(layout)
    next_kernel = decide(_configured_next(layout, config), read_grub(layout), kernels)
    return Report(
        health=overall(healths),
        kernel=kernel,
        boot_id=boot_id,
        generated_utc=iso(now),
        state_path=str(layout.state),
        state_error=state_error,
        state_boot_id=state.boot_id,
        config_path=str(layout.config),
        config_error=config_error,
        daemon=daemon,
        reboot=_reboot(layout, state, config, kernel, bundles, daemon, now, boot_id),
        problems=problems,
        bundles=bundles,
        memory=memory_summary(layout.sys),
        quarantine=tuple(quarantine.records(layout)),
        next_kernel=next_kernel,
        kernels=kernels,
        modules_locked=locked,
    )


def _bundle_problems(bundles: Mapping[str, BundleReport]) -> list[Problem]:
    """Each bundle's reasons as the host's problems, each with its own grade (the bundle's
    health for all of them when the grades do not match the reasons one for one)."""
    problems = []
    for name, b in bundles.items():
        grades = b.grades if len(b.grades) == len(b.reasons) else (b.health,) * len(b.reasons)
        problems += [Problem(name, h, r) for h, r in zip(grades, b.reasons, strict=True)]
    return problems


def _guard_problems(layout: Layout, config: Config | None, locked: bool | None) -> list[Problem]:
    """What weakens the host's guards on module loading: an unsafe trusted-certificate
    directory, and the module lock the config asks for not in force."""
    problems = [Problem(None, Health.DEGRADED, p) for p in trust_dir_problems(layout.trusted)]
    if config is not None and config.lock_modules and locked is False:
        why = (
            f"lock_modules is set and {layout.modules_disabled} is 0: any module can still be "
            "loaded (modstage boot locks it once it ran in this boot)"
        )
        problems.append(Problem(None, Health.DEGRADED, why))
    return problems


def _modules_locked(layout: Layout) -> bool | None:
    """Whether ``kernel.modules_disabled`` is 1 (None: it cannot be read)."""
    try:
        return layout.modules_disabled.read_text().strip() == "1"
    except OSError:
        return None

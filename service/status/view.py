"""How ``modstage status`` looks: rich tables on a terminal, plain lines otherwise.

Both views render the same :class:`~service.status.report.Report` that
:func:`service.status.collect.collect` returns; nothing here decides anything.
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING, TextIO

from service.host.nextboot import How
from service.status.glance import STOPPED, iso
from service.status.health import Health
from service.status.report import (
    BundleReport,
    HistoryRow,
    LoadedRow,
    Problem,
    Report,
    SignerLine,
)
from service.status.signer_rows import shadow_lines, signer_lines

if TYPE_CHECKING:
    from rich.console import Console

_MARK = {
    Health.HEALTHY: "ok",
    Health.UPGRADING: "UPGRADING",
    Health.DEGRADED: "DEGRADED",
    Health.FAILED: "FAILED",
}
_STYLE = {
    Health.HEALTHY: "green",
    Health.UPGRADING: "cyan",
    Health.DEGRADED: "yellow",
    Health.FAILED: "bold red",
}


def when(epoch: float | None) -> str:
    """A UTC ISO 8601 timestamp for a table cell ('-' when unknown)."""
    return iso(epoch) or "-"


def short(generation: str | None) -> str:
    """A generation id shortened as git shortens commits ('-' when none)."""
    return generation[:12] if generation else "-"


HISTORY_SHOWN = 5  # history entries a bundle shows in the plain view (--json: all)


def _more(name: str) -> str:
    """Where the whole history is."""
    return f"all: modstage status --json | jq '.bundles.{name}.history'"


def _deferred(b: BundleReport) -> tuple[str, ...]:
    """The status file's errors that say why a drop waits in incoming (a deferral: held,
    behind a rollback, its kernel not installed), not that something failed."""
    doc = b.status_file
    if doc is None or doc.drop is None or doc.phase in ("rejected", "failed"):
        return ()
    return tuple(doc.errors)


def _reboot_line(doc: Report) -> str:
    r = doc.reboot
    line = "required for " + ", ".join(r.bundles) if r.required else "not required"
    if r.scheduled:
        line += "; scheduled for " + ", ".join(r.scheduled)
    line += f": {r.why_not_asked}" if r.why_not_asked else ""
    if r.unknown is not None:  # status --reboot-required exits 3 ("cannot tell") alike
        return f"unknown: {r.unknown}"
    if r.held and r.gate:  # --reboot-required exits 4 alike
        line = r.gate
    elif r.gate:
        line += f"; {r.gate}"
    if r.backend is None or r.window is None:
        return f"{line} (backend and window unknown: the config is invalid)"
    w = r.window
    days = ",".join(w.days) if w.days and len(w.days) < 7 else "every day"
    opens = f", next open {r.next_window}" if r.next_window else ""
    opens = ", open now" if r.window_open else opens
    backend = "" if f"backend {r.backend}" in line else f"backend {r.backend}, "
    return (
        f"{line} ({backend}window {days} {w.start}-{w.end} "
        f"{w.timezone}{opens}, sentinel {'present' if r.sentinel_present else 'absent'})"
    )


def _problem(doc: Report, p: Problem) -> str:
    """One problem; an upgrade's also names the reboot it waits for."""
    text = f"{p.bundle or 'host'}: {p.reason}"
    b = doc.bundles.get(p.bundle or "")
    if b is not None and b.upgrading is not None and p.health is Health.UPGRADING:
        text += f"; reboot: {_reboot_line(doc)}"
    return text


def _daemon_line(doc: Report) -> str:
    d = doc.daemon
    if not d.at:
        return f"daemon: no heartbeat ({d.path}): not running"
    if d.decision == STOPPED:
        return f"daemon: stopped at {d.at}: not running (nobody asks for reboots)"
    alive = "alive" if d.alive else "NOT RESPONDING"
    line = f"daemon: {alive}, last heartbeat {d.at} ({d.age_seconds or 0:.0f} s ago)"
    if d.intake_paused:
        line += f"; TAKES NO DROP IN ({d.intake_paused}; retried at each scan)"
    return line


_SOURCE = {
    How.CONFIG: "[kernel] next in the config",
    How.NEXT_ENTRY: "grubenv's one-time next_entry",
    How.SAVED_ENTRY: "grubenv's saved_entry",
    How.GRUB_DEFAULT: "grub.cfg's default",
    How.NEWEST_INSTALLED: "the newest installed kernel (no grub.cfg)",
}


def _locked(doc: Report) -> str | None:
    """The module lock, when it is on."""
    if doc.modules_locked:
        return "modules: locked until the next reboot (kernel.modules_disabled = 1)"
    return None


def next_kernel_line(doc: Report) -> str | None:
    """The kernel the next boot runs and where that was read, or why it is unknown."""
    n = doc.next_kernel
    if n is None:
        return None
    fallback = f"; grub falls back: {n.fallback}" if n.fallback is not None else ""
    if n.release is None:
        return f"next boot: kernel unknown ({_SOURCE[n.how]}): {n.unknown}{fallback}"
    entry = f" {n.entry!r} ({n.title})" if n.entry is not None else ""
    running = ", the running one" if n.release == doc.kernel else ""
    return f"next boot: kernel {n.release}{running}, from {_SOURCE[n.how]}{entry}{fallback}"


def kernels_line(doc: Report) -> str | None:
    """The installed kernels, newest first, each with what it lacks or is (None: none)."""
    if not doc.kernels:
        return None
    shown = []
    for k in doc.kernels:
        notes = [
            note
            for note, holds in (
                ("running", k.release == doc.kernel),
                ("next boot", doc.next_kernel is not None and k.release == doc.next_kernel.release),
                ("no image", k.image is None),
                ("no module tree", k.modules is None),
            )
            if holds
        ]
        shown.append(f"{k.release} ({', '.join(notes)})" if notes else k.release)
    return "kernels: " + ", ".join(shown)


def _said(text: str, said: list[str]) -> bool:
    """Whether ``text`` was already printed (inside a longer line counts)."""
    return any(text and text in line for line in said)


def _module_state(m: LoadedRow) -> tuple[str, str]:
    """(how long it took, whether it is live) for one loaded module; what sysfs did not
    say is left out, never printed as None."""
    took = "already loaded" if m.already_loaded else f"{m.ms} ms" if m.ms is not None else "-"
    if m.live is None:
        return took, "NOT LIVE"
    return took, "live" if m.live.refcnt is None else f"live, refcnt {m.live.refcnt}"


def _move(h: HistoryRow) -> str:
    """One history entry: ``from -> to: note``, or an admin's act in its phase."""
    if h.from_ == h.to:
        return f"[{h.to}] {h.note or ''}".rstrip()
    return f"{h.from_} -> {h.to}"


def _history_text(h: HistoryRow) -> str:
    """One history entry with its note (``active -> pending: admin: rollback to …``)."""
    note = f": {h.note}" if h.note and h.from_ != h.to else ""
    return f"{_move(h)}{note}"


def generation_name(generation: str, version: str | None) -> str:
    """A generation as people name it: its version and short id (``2.0 (bbbbbbbbbbbb)``)."""
    return f"{version} ({short(generation)})" if version else short(generation)


def signer_text(s: SignerLine) -> str:
    """One signer of one generation on one line: ``signer of 1.0 (aaaaaaaaaaaa)
    'Example GPU vendor: 7aeac1f5…' for nvidia.ko, nvidia-uvm.ko: trusted by no keyring;
    loaded unverified (kernel tainted)`` (the name in quotes as the kernel logs a key)."""
    who = f"'{s.signer}'" if s.signer else "-"
    files = f" for {', '.join(s.files)}" if s.files else ""
    loaded = f"; {s.loaded}" if s.loaded else ""
    return f"signer of {generation_name(s.generation, s.version)} {who}{files}: {s.trust}{loaded}"


def _bundle_lines(name: str, b: BundleReport, out: list[str], *, issuers: bool = False) -> None:
    """Append one bundle's lines to ``out`` (a failure already printed is not repeated)."""
    held = " HELD" if b.held else ""
    waits = f" ({b.waiting})" if b.waiting else ""
    out.append(
        f"bundle {name}: {b.phase} [{_MARK[b.health]}]{held}{waits} "
        f"active {short(b.active)} pending {short(b.pending)}"
    )
    for g in b.generations:
        fail = ""
        if g.failed:
            fail = " failed" if _said(g.failed, out) else f" failed: {g.failed}"
        out.append(
            f"  {g.role:<8} {short(g.id)} {g.version} kernel {g.kernel} "
            f"added {when(g.added)} attempts {g.attempts}{fail}"
        )
    for m in b.loaded:
        took, state = _module_state(m)
        srcversion = f" srcversion {m.srcversion}" if m.srcversion else ""
        out.append(f"  module {m.module}{srcversion} ({took}; {state})")
    if devices_line(name, b):
        out.append(f"  {devices_line(name, b)}")
    for sig in signer_lines(b.signers):
        out.append(f"  {signer_text(sig)}")
        if issuers and sig.issuer:
            out.append(f"    issuer {sig.issuer}")
    out.extend(f"  {line}" for line in shadow_lines(b.signers, name))
    if len(b.history) > HISTORY_SHOWN:
        out.append(f"  history: the last {HISTORY_SHOWN} of {len(b.history)} ({_more(name)})")
    for h in b.history[-HISTORY_SHOWN:]:  # each entry with its own note, however often
        out.append(f"  {when(h.at)} {_history_text(h)}")
    deferred = _deferred(b)
    for err in b.errors[-5:]:
        text = err.split(": ", 1)[-1] if err[:12].isalnum() else err
        if not _said(text, out):
            out.append(f"  {'waits' if err in deferred else 'error'}: {err}")


def devices_line(name: str, b: BundleReport) -> str | None:
    """``"nvidia: 8 of 8 devices bound"`` (who has the others), or that none was present
    at boot; None when the bundle's modules are for no PCI device."""
    if b.devices is not None:
        return f"{name}: {b.devices.summary}"
    if b.phase == "no_device":
        return f"{name}: no device was present at boot (nothing loaded; the next boot retries)"
    return None


_REFUSED_GENERATION = re.compile(
    r"generation ([0-9a-f]{12}) (?:already failed|was rolled back by an admin)"
)


def _quarantine_lines(doc: Report) -> list[str]:
    """One line per quarantined drop (its reasons were escaped and bounded when recorded);
    a drop refused for a generation that failed or was rolled back says when that
    generation is active now (the advice of its reason, ``modstage retry``, no longer
    applies)."""
    out = []
    for q in doc.quarantine:
        line = f"quarantined {q.drop} ({'kept' if q.kept else 'removed'}, {when(q.at)}): "
        line += "; ".join(q.reasons)
        b = doc.bundles.get(q.bundle or "")
        refused = {m for r in q.reasons for m in _REFUSED_GENERATION.findall(r)}
        if b is not None and b.active is not None and b.active[:12] in refused:
            line += f" (since then {b.active[:12]} is active again: nothing to retry)"
        out.append(line)
    return out


def lines(doc: Report, *, issuers: bool = False) -> list[str]:
    """The plain-text view, one line per fact; each failure is printed once outside the
    history, which shows every entry with its own note (``issuers``:
    each signer's whole issuer name on a line below it)."""
    out = [
        f"host: {_MARK[doc.health]}  kernel {doc.kernel or '?'}",
        f"reboot: {_reboot_line(doc)}",
        _daemon_line(doc),
    ]
    out += [line for line in (next_kernel_line(doc), kernels_line(doc), _locked(doc)) if line]
    out += [f"  ! {_problem(doc, p)}" for p in doc.problems]
    for name, b in doc.bundles.items():
        _bundle_lines(name, b, out, issuers=issuers)
    out += _quarantine_lines(doc)
    for m in doc.memory:
        node = "-" if m.node is None else m.node
        out.append(f"memory node {node} zone {zone_words(m.zone)} {m.state}: {m.blocks} blocks")
    return out


def _rich_bundle(console: Console, name: str, b: BundleReport, *, issuers: bool = False) -> None:
    """One bundle's generations, loaded modules and last moves as tables."""
    from rich.markup import escape
    from rich.table import Table

    table = Table(title=f"{name}: {b.phase} ({b.health.label})", title_justify="left")
    for col in ("role", "generation", "version", "kernel", "added", "attempts", "failed"):
        wide = {"generation": 12, "added": 20}.get(col)
        table.add_column(col, overflow="fold", no_wrap=bool(wide), min_width=wide)
    for g in b.generations:
        table.add_row(
            g.role, short(g.id), g.version, g.kernel, when(g.added), str(g.attempts), g.failed or ""
        )
    console.print(table)
    if b.loaded:
        mods = Table(
            "module", "srcversion", "load ms", "live", title="loaded", title_justify="left"
        )
        for m in b.loaded:
            took, live = _module_state(m)
            mods.add_row(m.module, m.srcversion or "-", took, live)
        console.print(mods)
    if devices_line(name, b):
        console.print(f"  {devices_line(name, b)}", markup=False, highlight=False)
    if b.signers:
        keys = Table(title="signers", title_justify="left")
        for col in ("generation", "signer", "modules", "trusted", "loaded", "issuer"):
            if col != "issuer" or issuers:
                wide = 14 if col == "generation" else None  # "2.0 (bbbbbbbbbbbb)" folds there
                keys.add_column(col, overflow="fold", min_width=wide)  # ids are never cut
        for sig in signer_lines(b.signers):
            cells = [generation_name(sig.generation, sig.version), sig.signer or "-"]
            cells += [", ".join(sig.files), sig.trust, sig.loaded or ""]
            cells += [sig.issuer or "-"] if issuers else []
            keys.add_row(*(escape(c) for c in cells))
        console.print(keys)
    if len(b.history) > HISTORY_SHOWN:
        more = f"  history: the last {HISTORY_SHOWN} of {len(b.history)} ({_more(name)})"
        console.print(more, markup=False, highlight=False)
    for h in b.history[-HISTORY_SHOWN:]:
        console.print(f"  {when(h.at)} {_history_text(h)}", markup=False, highlight=False)


def render_rich(doc: Report, out: TextIO, *, issuers: bool = False) -> None:
    """Tables for a terminal (rich); ``issuers``: a column with each signer's issuer."""
    from rich.console import Console
    from rich.markup import escape
    from rich.table import Table

    console = Console(file=out)
    console.print(
        f"[{_STYLE[doc.health]}]{doc.health.label}[/]  kernel {doc.kernel or '?'}  "
        f"reboot {_reboot_line(doc)}",
        highlight=False,
    )
    console.print(_daemon_line(doc), highlight=False)
    for line in (next_kernel_line(doc), kernels_line(doc), _locked(doc)):
        if line:
            console.print(line, markup=False, highlight=False)
    for p in doc.problems:
        where = escape(_problem(doc, p))  # drop text: no markup
        console.print(f"  [yellow]![/] {where}", highlight=False)
    for name, b in doc.bundles.items():
        _rich_bundle(console, name, b, issuers=issuers)
    for text in _quarantine_lines(doc):
        console.print(text, markup=False, highlight=False)
    if doc.memory:
        mem = Table("node", "zone", "state", "blocks", title="memory", title_justify="left")
        for m in doc.memory:
            node = "-" if m.node is None else str(m.node)
            mem.add_row(node, zone_words(m.zone), m.state, str(m.blocks))
        console.print(mem)


def zone_words(zone: str | None) -> str:
    """A block's zone as an admin reads it. The kernel's ``valid_zones`` says ``none`` for
    an online block that spans zones (boot memory, which can be neither moved nor
    offlined); ``-``: the block is offline or its zone is unknown."""
    if zone == "none":
        return "several (boot memory, cannot be moved)"
    return zone or "-"


def render(doc: Report, out: TextIO, *, issuers: bool = False) -> None:
    """Rich tables when ``out`` is a terminal and rich is installed, plain lines otherwise
    (``issuers``: show each signer's whole issuer name too)."""
    if out.isatty():
        try:
            render_rich(doc, out, issuers=issuers)
            return
        except ImportError:
            pass
    out.write("\n".join(lines(doc, issuers=issuers)) + "\n")

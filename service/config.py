"""The host's policy, ``/etc/modstage/config.toml``: what bundles may ask for and limits.

Every key is optional; a missing file means the defaults. Unknown keys and
wrong types are errors naming the key, reported together.

.. code-block:: toml

    max_boot_attempts = 3          # boots a pending generation gets before it is failed
    retain = 3                     # generations kept per bundle besides active and pending
    allowed_bundles = []           # empty: any safe name
    allowed_memory_policies = ["offline", "online", "online_kernel", "online_movable"]
    forbidden_params = []          # parameter names no bundle may set
    allow_foreign_firmware_path = false   # may boot replace a firmware_class.path set by others
    require_symbol_crcs = true     # when none of the target's exports can be read (its
                                   # vmlinuz, in-tree modules, Module.symvers): refuse
                                   # (policy) a module whose imports cannot be checked
    hotplug_policy = "kernel"      # online hot-added memory: online | online_kernel |
                                   # online_movable, or "kernel" to leave it to the kernel
    incoming_dirs = ["/var/lib/modstage/incoming"]   # where containers drop (absolute,
                                   # under --root); e.g. add "/run/nvidia/modstage/incoming"
    [publish]                      # what containers outside /var/lib/modstage may read back
    status_dirs = []               # extra copies of status/<bundle>.json
    digest_files = {}              # bundle -> file its drop's config digest is written to
                                   # once its generation is live, e.g.
                                   # {nvidia = "/run/nvidia/nvidia-driver.state"}
    [limits]
    max_file_bytes = 2147483648
    max_total_bytes = 8589934592
    max_files = 10000
    max_manifest_bytes = 1048576
    max_tree_entries = 100000      # entries of a drop's tree removed or measured
    max_seconds = 600              # wall time to take one drop in
    quarantine_drops = 16          # rejected drops kept in quarantine/ for an admin
    quarantine_bytes = 268435456
    [reboot]
    backend = "none"               # kured | systemd | kexec | command | none
    command = []                   # argv for backend = "command"
    sentinel = "/var/run/reboot-required"   # kured's sentinel (default under --root)
    days = []                      # sun..sat; empty = every day (kured semantics)
    start = "00:00"                # window start, end (may span midnight), time zone
    end = "23:59:59"
    timezone = "UTC"
    min_delay = 60                 # seconds after the last drop before asking
    min_interval = 3600            # never ask again within this many seconds
"""

from __future__ import annotations

import tomllib
from dataclasses import dataclass, field, fields
from datetime import time
from pathlib import Path
from typing import Any

from service.errors import ConfigError
from service.window import DAYS, Guard, Window
from stager.manifest import MemoryPolicy

BACKENDS = ("kured", "systemd", "kexec", "command", "none")
HOTPLUG = ("kernel", "online", "online_kernel", "online_movable")


@dataclass(frozen=True)
class Limits:
    """Bounds on what one drop may make the host copy."""

    max_file_bytes: int = 2 << 30
    max_total_bytes: int = 8 << 30
    max_files: int = 10_000
    max_manifest_bytes: int = 1 << 20  # never more than the schema's 1 MiB
    max_tree_entries: int = 100_000  # entries of a drop's tree removed or measured
    max_seconds: int = 600  # wall time one drop may take to be taken in
    max_decompressed_bytes: int = 1 << 30  # what one drop's modules expand to, together
    quarantine_drops: int = 16  # rejected drops kept for an admin
    quarantine_bytes: int = 256 << 20  # and the bytes they may hold together


@dataclass(frozen=True)
class RebootConfig:
    """How and when to ask for a reboot."""

    backend: str = "none"
    command: tuple[str, ...] = ()
    sentinel: Path | None = None
    window: Window = field(default_factory=Window)
    guard: Guard = field(default_factory=Guard)


@dataclass(frozen=True)
class Config:
    """Host policy; defaults apply to every key the file leaves out."""

    max_boot_attempts: int = 3
    retain: int = 3
    allowed_bundles: tuple[str, ...] = ()
    allowed_memory_policies: tuple[MemoryPolicy, ...] = tuple(MemoryPolicy)
    forbidden_params: tuple[str, ...] = ()
    allow_foreign_firmware_path: bool = False
    # Imports are judged against the kernel's own CRCs (vmlinuz and in-tree modules, and
    # Module.symvers where installed). When none can be read, refuse (policy) a module
    # importing a symbol not otherwise known (true), or take it and say so (false).
    require_symbol_crcs: bool = True
    hotplug_policy: str = "kernel"
    limits: Limits = field(default_factory=Limits)
    reboot: RebootConfig = field(default_factory=RebootConfig)
    incoming_dirs: tuple[str, ...] = ("/var/lib/modstage/incoming",)
    publish: Publish = field(default_factory=lambda: Publish())

    @classmethod
    def load(cls, path: Path) -> Config:
        """Read ``path`` (defaults if it does not exist); raises :class:`ConfigError`."""
        data = _read(path)
        return cls() if data is None else cls.from_dict(data, path)

    @classmethod
    def salvage(cls, path: Path) -> tuple[Config, tuple[str, ...]]:
        """For the boot path: the config and no problems, or on problems the keys that
        are valid with defaults for the rest, and the problems (the caller logs them).

        Only ``boot`` uses this: it must never load less because of a typo, while
        ``serve`` and ``intake`` refuse an invalid config (:meth:`load`). The
        ``[reboot]`` table is the daemon's: boot neither reads nor judges it (its
        ``reboot`` is the default), so it never loads the time zone database either.
        """
        try:
            data = _read(path)
        except ConfigError as exc:
            return cls(), exc.problems
        if data is None:
            return cls(), ()
        data.pop("reboot", None)
        try:
            return cls.from_dict(data, path), ()
        except ConfigError as exc:
            problems = exc.problems
        values: dict[str, Any] = {}
        for key, value in data.items():
            try:
                values[key] = getattr(cls.from_dict({key: value}, path), key)
            except (ConfigError, AttributeError):
                continue  # unknown or invalid: the default applies
        return cls(**values), problems

    @classmethod
    def from_dict(cls, data: dict[str, Any], path: object = "config.toml") -> Config:
        """Validate a parsed table; raises :class:`ConfigError` listing every problem."""
        problems: list[str] = []
        values: dict[str, Any] = {}
        known = {f.name for f in fields(cls)}
        problems += [f"{k}: unknown key" for k in sorted(set(data) - known)]
        for key in ("max_boot_attempts", "retain"):
            if key in data:
                values[key] = _positive(data[key], key, problems)
        for key in ("allowed_bundles", "forbidden_params"):
            if key in data:
                values[key] = _strings(data[key], key, problems)
        if "allowed_memory_policies" in data:
            names = _strings(data["allowed_memory_policies"], "allowed_memory_policies", problems)
            try:
                values["allowed_memory_policies"] = tuple(MemoryPolicy(n) for n in names)
            except ValueError as exc:
                problems.append(f"allowed_memory_policies: {exc}")
        for key in ("allow_foreign_firmware_path", "require_symbol_crcs"):
            if key in data:
                if not isinstance(data[key], bool):
                    problems.append(f"{key}: must be a boolean")
                values[key] = data[key]
        if "hotplug_policy" in data:
            if data["hotplug_policy"] not in HOTPLUG:
                problems.append(f"hotplug_policy: must be one of {'|'.join(HOTPLUG)}")
            values["hotplug_policy"] = data["hotplug_policy"]
        if "limits" in data:
            values["limits"] = _limits(data["limits"], problems)
        if "reboot" in data:
            values["reboot"] = _reboot(data["reboot"], problems)
        if "incoming_dirs" in data:
            values["incoming_dirs"] = _host_paths(data["incoming_dirs"], "incoming_dirs", problems)
            if not values["incoming_dirs"]:
                problems.append("incoming_dirs: must name at least one directory")
        if "publish" in data:
            values["publish"] = _publish(data["publish"], problems)
        if problems:
            raise ConfigError(path, problems)
        return cls(**values)


@dataclass(frozen=True)
class Publish:
    """Where a bundle's status and config digest are published for containers to read.

    Paths are absolute host paths, fixed by the admin (resolved under the layout's root);
    never a path a container names.
    """

    status_dirs: tuple[str, ...] = ()
    digest_files: tuple[tuple[str, str], ...] = ()  # (bundle, path)

    def digest_file(self, bundle: str) -> str | None:
        """The file ``bundle``'s config digest goes to once live, or None."""
        return dict(self.digest_files).get(bundle)


def _host_paths(value: Any, key: str, problems: list[str]) -> tuple[str, ...]:
    """Absolute, normalized host paths (no '..', no '.', no empty component)."""
    paths = _strings(value, key, problems)
    for path in paths:
        parts = path.split("/")[1:]
        if not path.startswith("/") or any(p in ("", ".", "..") for p in parts):
            problems.append(f"{key}: {path!r} is not an absolute, normalized path")
    return tuple(dict.fromkeys(paths))


def _publish(value: Any, problems: list[str]) -> Publish:
    if not isinstance(value, dict):
        problems.append("publish: must be a table")
        return Publish()
    known = {"status_dirs", "digest_files"}
    problems += [f"publish.{k}: unknown key" for k in sorted(set(value) - known)]
    status = _host_paths(value.get("status_dirs", []), "publish.status_dirs", problems)
    files = value.get("digest_files", {})
    if not isinstance(files, dict):
        problems.append("publish.digest_files: must be a table of bundle = path")
        files = {}
    digests = []
    for bundle, path in sorted(files.items()):
        digests += [
            (bundle, p) for p in _host_paths([path], f"publish.digest_files.{bundle}", problems)
        ]
    return Publish(status_dirs=status, digest_files=tuple(digests))


def _positive(value: Any, key: str, problems: list[str]) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        problems.append(f"{key}: must be a positive integer")
        return 1
    return value


def _strings(value: Any, key: str, problems: list[str]) -> tuple[str, ...]:
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        problems.append(f"{key}: must be an array of strings")
        return ()
    return tuple(value)


def _limits(value: Any, problems: list[str]) -> Limits:
    if not isinstance(value, dict):
        problems.append("limits: must be a table")
        return Limits()
    known = {f.name for f in fields(Limits)}
    problems += [f"limits.{k}: unknown key" for k in sorted(set(value) - known)]
    return Limits(
        **{k: _positive(v, f"limits.{k}", problems) for k, v in value.items() if k in known}
    )


_REBOOT_KEYS = {
    "backend",
    "command",
    "sentinel",
    "days",
    "start",
    "end",
    "timezone",
    "min_delay",
    "min_interval",
}


def _reboot(value: Any, problems: list[str]) -> RebootConfig:
    if not isinstance(value, dict):
        problems.append("reboot: must be a table")
        return RebootConfig()
    problems += [f"reboot.{k}: unknown key" for k in sorted(set(value) - _REBOOT_KEYS)]
    backend = value.get("backend", "none")
    if backend not in BACKENDS:
        problems.append(f"reboot.backend: must be one of {'|'.join(BACKENDS)}")
    command = _strings(value.get("command", []), "reboot.command", problems)
    if backend == "command" and not command:
        problems.append('reboot.command: required (non-empty argv) for backend = "command"')
    days = tuple(d.lower()[:3] for d in _strings(value.get("days", []), "reboot.days", problems))
    problems += [f"reboot.days: {d!r} is not a day" for d in days if d not in DAYS]
    window = Window(
        days=days,
        start=_clock(value.get("start", "00:00"), "reboot.start", problems),
        end=_clock(value.get("end", "23:59:59"), "reboot.end", problems),
        timezone=_zone(value.get("timezone", "UTC"), problems),
    )
    guard = Guard(
        **{
            k: float(_seconds(value[k], f"reboot.{k}", problems))
            for k in ("min_delay", "min_interval")
            if k in value
        }
    )
    sentinel = value.get("sentinel")
    if sentinel is not None and not isinstance(sentinel, str):
        problems.append("reboot.sentinel: must be a string")
        sentinel = None
    return RebootConfig(
        backend=backend,
        command=command,
        sentinel=Path(sentinel) if sentinel else None,
        window=window,
        guard=guard,
    )


def _read(path: Path) -> dict[str, Any] | None:
    """The parsed ``path``, None if it does not exist; raises :class:`ConfigError`."""
    try:
        return tomllib.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return None
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError, RecursionError) as exc:
        raise ConfigError(path, [f"cannot read: {exc}"]) from exc


def _clock(value: Any, key: str, problems: list[str]) -> time:
    try:
        return time.fromisoformat(value)
    except (TypeError, ValueError):
        problems.append(f'{key}: must be a time of day like "22:00"')
        return time(0, 0)


def _zone(value: Any, problems: list[str]) -> str:
    from zoneinfo import ZoneInfo, ZoneInfoNotFoundError  # the [reboot] table's only

    try:
        ZoneInfo(value)
    except (TypeError, ValueError, ZoneInfoNotFoundError):
        problems.append(f"reboot.timezone: {value!r} is not a known time zone")
        return "UTC"
    return str(value)


def _seconds(value: Any, key: str, problems: list[str]) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or value < 0:
        problems.append(f"{key}: must be a non-negative number of seconds")
        return 0.0
    return float(value)

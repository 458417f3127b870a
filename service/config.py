"""The host's policy, ``/etc/modstage/config.toml``: what bundles may ask for and limits.

Every key is optional; a missing file means the defaults. Unknown keys, wrong types
and bad values are errors naming the key and the value, reported together.
``docs/config.md`` is the reference: each key's type, default, meaning and an example.

.. code-block:: toml

    max_boot_attempts = 3          # boots a pending generation gets before it is failed
    retain = 3                     # generations kept per bundle besides active and pending
    allowed_bundles = []           # empty: any safe name
    allowed_memory_policies = ["offline", "online", "online_kernel", "online_movable"]
    forbidden_params = []          # parameter names no bundle may set
    allow_foreign_firmware_path = false   # may boot replace a firmware_class.path set by others
    lock_modules = false           # after boot: kernel.modules_disabled = 1 until the next
                                   # reboot (nothing loads a module, udev's autoload neither)
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
    [bundles.nvidia]               # what the host allows one bundle beyond the defaults
    firmware = []                  # globs of firmware names it may ship undeclared
    firmware_override = []         # globs of names it may shadow from /lib/firmware
    shadow_in_tree = []            # globs of the target kernel's module names it may take
    modules = []                   # globs of the only module names it may carry (empty: any)
    params = []                    # globs of the only parameter names it may set (empty: any)
    signers = []                   # certificates that may sign its modules: file names in
                                   # trusted.d or key identifiers in hex (empty: any trusted)
    min_version = "550.0"          # the lowest version its drops may have (unset: none)
    [limits]
    max_file_bytes = 2147483648
    max_total_bytes = 8589934592
    max_files = 10000
    max_manifest_bytes = 1048576
    max_tree_entries = 100000      # entries of a drop's tree removed or measured
    max_seconds = 600              # wall time to take one drop in
    max_decompressed_bytes = 1073741824   # what one drop's compressed modules expand to
    quarantine_drops = 16          # rejected drops kept in quarantine/ for an admin
    quarantine_bytes = 268435456
    [node_labels]                  # each bundle's phase and versions as node labels, through
    enabled = true                 # node-feature-discovery's features.d (where it exists)
    prefix = "modstage.io"         # label prefix: never kubernetes.io, k8s.io or nvidia.com
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
    upgrading_bound = 14400        # seconds a bundle may be without its driver for a pending
                                   # upgrade before status calls it failed (unset: the
                                   # window's longest closed stretch + min_delay + 2 h)
    [kernel]
    next = "6.12.57+deb13-amd64"   # the kernel the next boot runs, where grub's files do
                                   # not say it (unset: read grub.cfg and grubenv)
    hold_max = 259200              # seconds a reboot into a new kernel waits for a bundle
                                   # with no generation for it (0: never)
"""

from __future__ import annotations

import re
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from service.bundlepolicy import BundlePolicy as BundlePolicy  # re-exported: its home before
from service.bundlepolicy import load_bundles
from service.config_values import shown, strings
from service.errors import ConfigError
from service.layout import is_release
from service.limits import POSITIVE as _POSITIVE
from service.limits import Limits as Limits  # re-exported: its home before
from service.rebooting.config import REBOOT_KEYS as REBOOT_KEYS  # re-exported: its home before
from service.rebooting.config import RebootConfig as RebootConfig  # re-exported
from service.rebooting.config import reboot_table
from stager.schema.manifest import MemoryPolicy
from stager.schema.record import RecordError, load, spec

HOTPLUG = ("kernel", "online", "online_kernel", "online_movable")


_SUBDOMAIN = re.compile(
    r"[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?(\.[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?)*\Z"
)
# label namespaces Kubernetes denies, or the GPU operator or node-feature-discovery own
_OWNED_LABELS = ("kubernetes.io", "k8s.io", "nvidia.com")


def _prefix_problem(prefix: str) -> str | None:
    if len(prefix) > 253 or not _SUBDOMAIN.match(prefix):
        return f"{prefix!r} is not a DNS subdomain (lowercase, digits, '-', '.')"
    owned = [o for o in _OWNED_LABELS if prefix == o or prefix.endswith(f".{o}")]
    if owned:
        return f"{prefix!r} is under {owned[0]}, which Kubernetes, the GPU operator or NFD own"
    return None


@dataclass(frozen=True)
class NodeLabels:
    """``[node_labels]``: each bundle's state as node labels (:mod:`service.publish.labels`)."""

    enabled: bool = True  # written only where NFD's features.d directory exists
    prefix: str = field(default="modstage.io", metadata=spec(check=_prefix_problem))


#: ``[kernel] hold_max``'s default: three days, a weekend for a driver image's pipeline
HOLD_MAX = 3 * 86400


def _not_negative(value: int) -> str | None:
    return None if value >= 0 else f"{value} is not a non-negative number of seconds"


def _release_problem(release: str | None) -> str | None:
    if release is None or is_release(release):
        return None
    return f"{shown(release)} is not a kernel release (as uname -r prints it)"


@dataclass(frozen=True)
class KernelChoice:
    """``[kernel]``: which kernel the next boot runs, when the admin says it
    (:mod:`service.host.nextboot`; unset: grub's files say it)."""

    next: str | None = field(default=None, metadata=spec(check=_release_problem))
    # seconds after the next kernel was installed that a reboot into it waits for the
    # bundles with no generation for it (:mod:`service.rebooting.gate`); 0: never wait
    hold_max: int = field(default=HOLD_MAX, metadata=spec(check=_not_negative))


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
    paths = strings(value, key, problems)
    for path in paths:
        parts = path.split("/")[1:]
        if not path.startswith("/") or any(p in ("", ".", "..") for p in parts):
            problems.append(f"{key}: {path!r} is not an absolute, normalized path")
    return tuple(dict.fromkeys(paths))


def _publish(value: Any, _: str, problems: list[str]) -> Publish:
    if not isinstance(value, dict):
        problems.append(f"publish: {shown(value)} is not a table")
        return Publish()
    known = {"status_dirs", "digest_files"}
    problems += [f"publish.{k}: unknown key" for k in sorted(set(value) - known)]
    status = _host_paths(value.get("status_dirs", []), "publish.status_dirs", problems)
    files = value.get("digest_files", {})
    if not isinstance(files, dict):
        problems.append(f"publish.digest_files: {shown(files)} is not a table of bundle = path")
        files = {}
    digests = []
    for bundle, path in sorted(files.items()):
        at = f"publish.digest_files.{bundle}"
        if not isinstance(path, str):
            problems.append(f"{at}: {shown(path)} is not a path (a string)")
            continue
        digests += [(bundle, p) for p in _host_paths([path], at, problems)]
    return Publish(status_dirs=status, digest_files=tuple(digests))


def _read(path: Path) -> dict[str, Any] | None:
    """The parsed ``path``, None if it does not exist; raises :class:`ConfigError`."""
    try:
        return tomllib.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return None
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError, RecursionError) as exc:
        raise ConfigError(path, [f"cannot read: {exc}"]) from exc


def _hotplug(value: str) -> str | None:
    return None if value in HOTPLUG else f"{shown(value)} is not one of {'|'.join(HOTPLUG)}"


def _some_directory(dirs: tuple[str, ...]) -> str | None:
    return None if dirs else "[] names no directory: at least one is needed"


@dataclass(frozen=True)
class Config:
    """Host policy; defaults apply to every key the file leaves out."""

    max_boot_attempts: int = field(default=3, metadata=_POSITIVE)
    retain: int = field(default=3, metadata=_POSITIVE)
    allowed_bundles: tuple[str, ...] = ()
    allowed_memory_policies: tuple[MemoryPolicy, ...] = tuple(MemoryPolicy)
    forbidden_params: tuple[str, ...] = ()
    allow_foreign_firmware_path: bool = False
    # after ``modstage boot`` loaded every bundle: kernel.modules_disabled = 1 (no module loads
    # until the next reboot, from anyone: udev's autoload, a privileged container, modstage)
    lock_modules: bool = False
    # Imports are judged against the kernel's own CRCs (vmlinuz and in-tree modules, and
    # Module.symvers where installed). When none can be read, refuse (policy) a module
    # importing a symbol not otherwise known (true), or take it and say so (false).
    require_symbol_crcs: bool = True
    hotplug_policy: str = field(default="kernel", metadata=spec(check=_hotplug))
    limits: Limits = field(default_factory=Limits)
    reboot: RebootConfig = field(default_factory=RebootConfig, metadata=spec(load=reboot_table))
    incoming_dirs: tuple[str, ...] = field(
        default=("/var/lib/modstage/incoming",),
        metadata=spec(load=_host_paths, check=_some_directory),
    )
    publish: Publish = field(default_factory=lambda: Publish(), metadata=spec(load=_publish))
    node_labels: NodeLabels = field(default_factory=NodeLabels)
    bundles: tuple[tuple[str, BundlePolicy], ...] = field(
        default=(), metadata=spec(load=load_bundles)
    )
    kernel: KernelChoice = field(default_factory=KernelChoice)

    def bundle_policy(self, bundle: str) -> BundlePolicy:
        """``[bundles.<bundle>]``, or the defaults when the file has no such table."""
        return dict(self.bundles).get(bundle, BundlePolicy())

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
        try:
            return load(cls, data)
        except RecordError as exc:
            raise ConfigError(path, [_with_value(p, data) for p in exc.problems]) from None


# the type problems :mod:`stager.schema.record` words for every record (``at: must be X, not Y``)
_TYPE_PROBLEM = re.compile(r"(?P<at>[^:]+): must be (?P<what>.+), not [^,]+\Z")
_STEP = re.compile(r"([^.\[\]]+)|\[(\d+)\]")  # ``limits.max_files``, ``allowed_bundles[1]``


def _with_value(problem: str, data: dict[str, Any]) -> str:
    """A type problem said with the value the file gave, as the other problems are
    (``max_files: must be an integer, not a string``: ``max_files: '10k' is not an integer``)."""
    match = _TYPE_PROBLEM.match(problem)
    if match is None:
        return problem
    value: Any = data
    try:
        for name, index in _STEP.findall(match["at"]):
            value = value[int(index)] if index else value[name]
    except (KeyError, IndexError, TypeError):
        return problem
    return f"{match['at']}: {shown(value)} is not {match['what']}"

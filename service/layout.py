"""Every path modstage uses, rooted at one prefix so tests run on a temporary tree.

Logic never spells ``/etc``, ``/var``, ``/run``, ``/sys`` or ``/proc``; it asks a
:class:`Layout`.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

#: a kernel release as it names files (``/boot/vmlinuz-<release>``): what ``uname -r`` prints,
#: at most 64 characters (``__NEW_UTS_LEN``), no '/', no space
_RELEASE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._+~-]{0,63}\Z")


def is_release(text: str) -> bool:
    """Whether ``text`` can name a kernel release and its files (not a dpkg leftover such as
    ``vmlinuz-6.1.0-50-amd64.dpkg-tmp``)."""
    return bool(_RELEASE.match(text)) and ".dpkg-" not in text


def is_host_root(root: Path) -> bool:
    """Whether ``root`` is the machine's own ``/`` (resolved: a link to ``/`` is too), not a
    sandbox: the one place that tells them apart (:class:`service.host.running.RunningHost`
    and :func:`root_problem` ask it)."""
    resolved = root.resolve()
    return resolved == Path(resolved.anchor)


def root_problem(root: Path, *, kernel_tree: bool = False) -> str | None:
    """Why ``--root`` cannot be acted on, or None. ``/`` always can (a fresh host has nothing
    yet); any other root must be a directory holding ``etc/modstage`` or ``var/lib/modstage``
    (a host or sandbox, docs/sandbox.md), or with ``kernel_tree`` (``verify``, which judges
    against any kernel's files) a kernel's ``lib/modules``, ``usr/lib/modules`` (merged /usr)
    or ``boot``: a typo is refused
    before any command creates a file under it."""
    if is_host_root(root):
        return None
    if not root.is_dir():
        return f"--root {root} does not exist or is not a directory"
    trees = ("lib/modules", "usr/lib/modules", "boot")
    marks = ("etc/modstage", "var/lib/modstage", *(trees * kernel_tree))
    if not any((root / p).is_dir() for p in marks):
        tree = ", nor a kernel tree (lib/modules, usr/lib/modules, boot)" if kernel_tree else ""
        return (
            f"--root {root} is not a modstage host or sandbox: it holds neither etc/modstage "
            f"nor var/lib/modstage{tree} (modstage sandbox {root} --kernel RELEASE --trust CERT "
            "lays one out; docs/sandbox.md)"
        )
    return None


@dataclass(frozen=True)
class Layout:
    """The on-disk contract of modstage under ``root`` (``/`` on a real host): every answer
    is a path made from ``root`` alone; nothing here reads the filesystem (the running
    host's facts are :class:`service.host.running.RunningHost`'s, which of a kernel's
    places holds its files :func:`modules_dir`'s, :func:`kernel_image`'s and
    :func:`kernel_config`'s)."""

    root: Path = Path("/")

    def _under(self, absolute: str) -> Path:
        return self.root / absolute.lstrip("/")

    def host(self, path: Path | str) -> Path:
        """A host path named in the config (``/run/x``), under this layout's root."""
        return self._under(str(path))

    # admin-owned configuration
    @property
    def etc(self) -> Path:
        """Directory of the host's modstage configuration."""
        return self._under("/etc/modstage")

    @property
    def config(self) -> Path:
        """The host policy file."""
        return self.etc / "config.toml"

    @property
    def trusted(self) -> Path:
        """Directory of certificates whose keys may sign modules."""
        return self.etc / "trusted.d"

    # persistent state on the node's ephemeral volume
    @property
    def var(self) -> Path:
        """modstage's persistent directory."""
        return self._under("/var/lib/modstage")

    @property
    def incoming(self) -> Path:
        """Where containers drop bundles (the container may write here)."""
        return self.var / "incoming"

    @property
    def store(self) -> Path:
        """Verified, read-only generations, one directory per generation id."""
        return self.var / "store"

    @property
    def boot_window(self) -> Path:
        """Which boot's one chance to load modules is taken, and by whom
        (:mod:`service.boot.once`): persistent, so clearing ``/run`` cannot reopen it."""
        return self.var / "boot-window.json"

    @property
    def state(self) -> Path:
        """The per-bundle state file."""
        return self.var / "state.json"

    @property
    def status(self) -> Path:
        """Per-bundle status files, mounted read-only into containers."""
        return self.var / "status"

    @property
    def config_digests(self) -> Path:
        """Config digests that drops carried, one file per generation id."""
        return self.var / "config-digest"

    @property
    def quarantine(self) -> Path:
        """Rejected drops kept for an admin to inspect (root only, bounded)."""
        return self.var / "quarantine"

    @property
    def trash(self) -> Path:
        """Drops taken in or superseded, renamed here at once and removed after the scan."""
        return self.var / ".trash"

    @property
    def metrics(self) -> Path:
        """The Prometheus textfile (node-exporter's textfile collector; Debian's directory)."""
        return self._under("/var/lib/prometheus/node-exporter/modstage.prom")

    # runtime
    @property
    def run(self) -> Path:
        """Runtime directory (snapshot for ``status``, firmware view)."""
        return self._under("/run/modstage")

    @property
    def heartbeat(self) -> Path:
        """The daemon's heartbeat file (refreshed every loop; ``status`` shows its age)."""
        return self.run / "heartbeat.json"

    @property
    def unloads(self) -> Path:
        """When each module left the kernel in this boot (the daemon's record of the
        kernel's module ``remove`` uevents; :mod:`service.status.unloads`)."""
        return self.run / "unloads.json"

    @property
    def kernel_hook(self) -> Path:
        """Where the package's kernel hook (``/etc/kernel/postinst.d/zzz-modstage``, and
        ``postrm.d``'s) tells the daemon that a kernel package was installed or removed: it
        writes a file here, which the daemon watches (it makes the directory)."""
        return self.run / "kernel-hook"

    @property
    def reboot_sentinel(self) -> Path:
        """kured's default sentinel file."""
        return self._under("/var/run/reboot-required")

    # kernel interfaces
    @property
    def sys(self) -> Path:
        """The sysfs mount."""
        return self._under("/sys")

    @property
    def proc(self) -> Path:
        """The procfs mount."""
        return self._under("/proc")

    @property
    def sig_enforce(self) -> Path:
        """Whether the kernel enforces module signatures (``Y``); absent without them."""
        return self.sys / "module/module/parameters/sig_enforce"

    @property
    def lockdown(self) -> Path:
        """The kernel's lockdown mode, the active one in brackets; absent without it."""
        return self.sys / "kernel/security/lockdown"

    @property
    def tainted(self) -> Path:
        """The kernel's taint mask, in decimal (bit 13: a module loaded unverified)."""
        return self.proc / "sys/kernel/tainted"

    @property
    def boot_id(self) -> Path:
        """The kernel's random id of the current boot."""
        return self.proc / "sys/kernel/random/boot_id"

    @property
    def os_release(self) -> Path:
        """The running kernel's release string (``uname -r``)."""
        return self.proc / "sys/kernel/osrelease"

    @property
    def modules_disabled(self) -> Path:
        """``kernel.modules_disabled``: 1 once module loading is locked until the reboot."""
        return self.proc / "sys/kernel/modules_disabled"

    # the target kernel's own files (read by service.verify.targetkernel.kernel; which of
    # the places holds them is found by modules_dir, kernel_image and kernel_config below,
    # outside Layout, which names paths and reads nothing). Two layouts exist
    # on real hosts: /boot/vmlinuz-<release> and /boot/config-<release> beside
    # /lib/modules/<release> (Debian 12 and 13), or everything in /usr/lib/modules/<release>
    # (vmlinuz, config, System.map: Debian's 7.2 packages, Fedora, Arch); /boot is read first
    @property
    def boot(self) -> Path:
        """The directory of kernel images and the boot loader's files."""
        return self._under("/boot")

    def module_trees(self) -> tuple[Path, ...]:
        """The directories holding one module tree per installed kernel release
        (``/lib/modules``, then merged /usr's ``/usr/lib/modules``; :func:`modules_dir`
        picks the one a release's tree is in)."""
        return (self._under("/lib/modules"), self._under("/usr/lib/modules"))

    @property
    def grub_cfg(self) -> Path:
        """grub's menu, as grub-mkconfig writes it (``update-grub``)."""
        return self.grub_dir / "grub.cfg"

    @property
    def grub_dir(self) -> Path:
        """grub's directory in the boot directory (``grub.cfg``, ``grubenv``)."""
        return self.boot / "grub"

    @property
    def grubenv(self) -> Path:
        """grub's environment block (``saved_entry``, the one-time ``next_entry``)."""
        return self.grub_dir / "grubenv"

    def firmware_dirs(self, release: str) -> tuple[Path, ...]:
        """The directories a kernel release's firmware loader searches after
        ``firmware_class.path``, in its order (``fw_path[]``,
        drivers/base/firmware_loader/main.c; the strings are in Debian's images)."""
        base = self._under("/lib/firmware")
        return (base / "updates" / release, base / "updates", base / release, base)

    def exports_cache(self, release: str) -> Path:
        """The parsed exports of a kernel release (see ``service.verify.targetkernel.exports``)."""
        return self.var / "cache" / f"exports-{release}"

    @property
    def proc_config(self) -> Path:
        """The running kernel's configuration, where ``CONFIG_IKCONFIG_PROC`` is set."""
        return self.proc / "config.gz"


def modules_dir(layout: Layout, release: str) -> Path:
    """A kernel release's module tree (in-tree modules, ``modules.builtin``) under
    ``layout``: ``/lib/modules/<release>``, else ``/usr/lib/modules/<release>`` where only
    that exists (a root without the merged-/usr link)."""
    legacy, merged = (tree / release for tree in layout.module_trees())
    return merged if not legacy.exists() and merged.exists() else legacy


def kernel_image(layout: Layout, release: str) -> Path:
    """A kernel release's image, whose payload lists vmlinux's exports and CRCs:
    ``/boot/vmlinuz-<release>``, else ``vmlinuz`` in its module tree."""
    return _kernel_file(layout, f"vmlinuz-{release}", release, "vmlinuz")


def kernel_config(layout: Layout, release: str) -> Path:
    """A kernel release's build configuration, as distributions install it:
    ``/boot/config-<release>``, else ``config`` in its module tree."""
    return _kernel_file(layout, f"config-{release}", release, "config")


def _kernel_file(layout: Layout, in_boot: str, release: str, in_modules: str) -> Path:
    """The file in /boot if it is there, else the module tree's if that one is, else the
    /boot path (which the caller's error names)."""
    boot = layout.boot / in_boot
    if boot.exists():
        return boot
    beside = modules_dir(layout, release) / in_modules
    return beside if beside.exists() else boot

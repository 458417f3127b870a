"""The target kernel, as verification needs it: release, full vermagic, build configuration.

One :class:`Target` is shared by ``modstage verify``, intake, boot and the differential
oracle, so all of them judge a module against the same facts. Each fact records where it
came from; when one is missing the verdict says so and modstage assumes the less capable
kernel. Where each is read and what is assumed without it is docs/verify.md's "Target kernel
facts"; which rules the release and the configuration decide is :attr:`Target.rules`
(:mod:`service.verify.targetkernel.rules`).
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field, replace
from functools import cached_property
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from service.verify.modfile.modinfo import ModInfo

from service.errors import ModuleRejected
from service.layout import Layout, kernel_config, kernel_image, modules_dir
from service.verify.modfile.symtab import Export
from service.verify.targetkernel.exports import KernelExports, Sources
from service.verify.targetkernel.kconfig import KernelConfig
from service.verify.targetkernel.rules import KernelRules
from stager.schema.paths import MODULE_SUFFIXES, normalize_module_name

_SUFFIXES = MODULE_SUFFIXES  # the container's own list
_MAX_PROBES = 50


@dataclass(frozen=True)
class Target:
    """The kernel a module must load into, with the source of every fact."""

    release: str
    vermagic: str | None
    vermagic_source: str
    config: KernelConfig
    builtin: frozenset[str] = field(default_factory=frozenset)
    exports: KernelExports = field(default_factory=lambda: KernelExports(None, {}))
    # built-ins with a /sys/module/<name> entry, read from the running kernel's /sys/module;
    # None: read from the image with the exports (see sysfs_names)
    builtin_sysfs: frozenset[str] | None = None
    # when the target's exports cannot all be read, refuse (policy) a module importing a
    # symbol they do not name; boot sets it False: intake judged the same kernel already
    strict_crcs: bool = True
    struct_module: int | None = None  # sizeof(struct module), from the probed module

    @classmethod
    def from_layout(cls, layout: Layout, release: str | None = None) -> Target:
        """Read the facts under ``layout.root``; ``release`` defaults to the running one."""
        running = _running(layout)
        release = release or running
        if release is None:
            raise ModuleRejected(
                "EINVAL", f"no target release given and {layout.os_release} unreadable"
            )
        modules = modules_dir(layout, release)
        vermagic, source, probe = _vermagic(modules)
        probed = {} if probe is None else {
            name: Export(crc, False, "", source) for name, crc in probe.versions
        }  # fmt: skip
        sources = Sources(kernel_image(layout, release), modules, layout.exports_cache(release))
        return cls(
            release,
            vermagic,
            source,
            _config(layout, release, running),
            _builtin(modules / "modules.builtin"),
            KernelExports(sources, probed),
            _running_sysfs(layout) if release == running else None,
            struct_module=None if probe is None else probe.this_module_size,
        )

    @classmethod
    def from_spec(cls, kernel: str, config: KernelConfig | None = None) -> Target:
        """A release or a full vermagic given by the caller; nothing read from disk."""
        release = kernel.split(" ", 1)[0]
        if " " in kernel:
            vermagic, source = kernel, "given"
        else:
            vermagic, source = None, f"not given (only the release {release!r})"
        return cls(release, vermagic, source, config or KernelConfig.missing("not read"))

    def probe_only(self) -> Target:
        """This target knowing only the probed module's CRCs: its exports never read.

        ``modstage boot`` judges with it: the kernel resolves every import when it loads
        the module, and intake judged the same kernel's exports already. ``module_layout``'s
        CRC (ENOEXEC) is still checked.
        """
        return replace(self, exports=self.exports.probe_only(), strict_crcs=False)

    def sysfs_names(self) -> tuple[frozenset[str] | None, str]:
        """(the names built-in code has under /sys/module, where they were read); None when
        neither the running kernel's /sys/module nor the image could be read."""
        if self.builtin_sysfs is not None:
            return self.builtin_sysfs, "the running kernel's /sys/module"
        if self.exports.sources is None:
            return None, "not read"
        found = self.exports.table.builtin_sysfs
        return found, f"{self.exports.sources.image} (__param, __modver)"

    @property
    def links(self) -> bool:
        """Whether modules are judged on symbol resolution (their symbol tables read):
        where the exports can be read, or a strict target must refuse unknown imports."""
        return self.exports.sources is not None or self.strict_crcs

    @cached_property
    def rules(self) -> KernelRules:
        """Which of the kernel's rules this target applies, from its release and config."""
        return KernelRules.of(self.release, self.config)

    @property
    def modversions(self) -> bool | None:
        """Whether the kernel checks symbol CRCs (``CONFIG_MODVERSIONS``): its ``same_magic``
        skips the release word of a module with ``__versions`` and its ``check_version``
        compares CRCs only then (Debian's 7.2 is built without). None: no config read."""
        return self.rules.modversions

    @property
    def decompress(self) -> str | None:
        """The one format ``finit_module(MODULE_INIT_COMPRESSED_FILE)`` takes (the kernel
        builds one decompressor), or None: boot hands such a module over as it is stored."""
        if not self.config.enabled("MODULE_DECOMPRESS"):
            return None
        for kind, option in (("gz", "MODULE_COMPRESS_GZIP"), ("xz", "MODULE_COMPRESS_XZ")):
            if self.config.enabled(option):
                return kind
        if self.rules.zstd_decompress and self.config.enabled("MODULE_COMPRESS_ZSTD"):
            return "zst"
        return None

    @property
    def firmware_suffixes(self) -> tuple[str, ...]:
        """The suffixes the firmware loader tries a name with, in its order: the name as
        given in every directory first, then ``.zst`` (``FW_LOADER_COMPRESS_ZSTD``), then
        ``.xz`` (``FW_LOADER_COMPRESS_XZ``) (``_request_firmware``). Without a config read,
        both are assumed: more names then count as the host's."""
        if not self.config.known:
            return ("", ".zst", ".xz")
        options = (("FW_LOADER_COMPRESS_ZSTD", ".zst"), ("FW_LOADER_COMPRESS_XZ", ".xz"))
        return ("", *(suffix for option, suffix in options if self.config.enabled(option)))

    def notes(self) -> tuple[str, ...]:
        """What was missing and what was assumed instead, for the verdict."""
        out = []
        if self.vermagic is None:
            out.append(f"target vermagic {self.vermagic_source}")
        said = f"symbols: {self.exports.describe()}"
        if not self.exports.complete:
            said += "; " + (
                "a module importing another symbol is refused (policy)"
                if self.strict_crcs
                else "other symbols are left to the kernel (CRC mismatches are not caught)"
            )
        out.append(said)
        table = self.exports.table
        out += [f"symbols: {p}" for p in table.problems]
        if self.exports.cache_note:
            out.append(f"symbols: {self.exports.cache_note}")
        if table.disagree:
            first = next(iter(table.disagree.items()))
            out.append(
                f"symbols: the target's files disagree about {len(table.disagree)} CRCs "
                f"(e.g. {first[0]}: {first[1]}); a module importing one is refused (policy)"
            )
        if not self.config.known:
            out.append(
                f"target config {self.config.source}; assumed no ECDSA, no in-kernel "
                "decompression, no MODULE_FORCE_LOAD, STRICT_MODULE_RWX=y"
            )
        return tuple(out)

    def to_json(self) -> dict[str, Any]:
        """The facts and their sources, for ``modstage verify --json``."""
        return {
            "release": self.release,
            "vermagic": self.vermagic,
            "vermagic_source": self.vermagic_source,
            "config_source": self.config.source,
            "symbols_source": self.exports.describe(),
            "notes": list(self.notes()),
        }


def _running(layout: Layout) -> str | None:
    """The running kernel's release under ``layout``, None when unreadable or empty: the
    rule of :class:`service.host.running.RunningHost`, read here because the verify stack
    does not import ``service.host`` (``modstage verify`` and intake name their target)."""
    try:
        return layout.os_release.read_text().strip() or None
    except (OSError, UnicodeDecodeError):
        return None


def _vermagic(directory: Path) -> tuple[str | None, str, ModInfo | None]:
    """(``vermagic=``, its source, the module's facts) of the first readable in-tree module."""
    from service.verify.modfile.modinfo import read_installed  # modinfo imports nothing from here

    tree = directory / "kernel"
    probes = 0
    for dirpath, dirnames, filenames in os.walk(tree):
        dirnames.sort()
        for name in sorted(filenames):
            if not name.endswith(_SUFFIXES):
                continue
            path = Path(dirpath) / name
            probes += 1
            info = read_installed(path)
            if info is not None and info.vermagic is not None:
                return info.vermagic, str(path), info
            if probes >= _MAX_PROBES:
                why = f"not found: no readable vermagic in {probes} modules under {tree}"
                return None, why, None
    return None, f"not found: no in-tree module under {tree}", None


def _config(layout: Layout, release: str, running: str | None) -> KernelConfig:
    path = kernel_config(layout, release)
    try:
        return KernelConfig.parse(path.read_text(errors="replace"), str(path))
    except OSError:
        pass
    if release == running:
        try:
            import gzip  # only when the running kernel's config is read from /proc

            with gzip.open(layout.proc_config, "rt", errors="replace") as f:
                return KernelConfig.parse(f.read(), str(layout.proc_config))
        except (OSError, EOFError):
            pass
        return KernelConfig.missing(f"neither {path} nor {layout.proc_config}")
    return KernelConfig.missing(f"no {path}")


def _builtin(path: Path) -> frozenset[str]:
    try:
        lines = path.read_text(errors="replace").split()
    except OSError:
        return frozenset()
    names = (line.rstrip("/").rsplit("/", 1)[-1] for line in lines)  # kernel/x/y.ko -> y.ko
    return frozenset(normalize_module_name(n.split(".ko")[0]) for n in names)


def _running_sysfs(layout: Layout) -> frozenset[str] | None:
    """The running kernel's /sys/module entries for built-in code: the directories without
    ``initstate``, which only a loaded module has (6.12's ``compression`` there is a file, an
    attribute of the module kset, and no name a module is refused); None when /sys/module
    is not there."""
    directory = layout.sys / "module"
    try:
        entries = [e for e in os.scandir(directory) if e.is_dir(follow_symlinks=False)]
    except OSError:
        return None
    names = (e.name for e in entries if not os.path.lexists(os.path.join(e.path, "initstate")))
    return frozenset(normalize_module_name(name) for name in names)

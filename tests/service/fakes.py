"""The one place for fakes of the host's side effects, and a temporary host tree.

:class:`FakeKernel` and :class:`FakeSysfs` answer as Linux 6.1 does (kernel/module/main.c,
drivers/base/memory.c, kernel/params.c); ``tests/contract`` runs the same assertions
against them and against the real kernel in the test VM, so they cannot drift apart.
"""

from __future__ import annotations

import errno
import os
import shutil
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from service.errors import LoadError, ModuleRejected
from service.host.modules import Kernel, describe
from service.host.sysfs import Sysfs
from service.layout import Layout
from service.verify.modfile.modinfo import ModInfo, ReadAt
from stager.schema.paths import normalize_module_name
from tests.hosts import BOOT_ID, running_host
from tests.kmod.target import install_target

if TYPE_CHECKING:
    from service.boot.loader import Boot
    from service.config import Config
    from service.intake.scan import Intake
    from service.verify.signature.keyring import Keyring


def module_identity(read_at: ReadAt, size: int, fallback: str) -> ModInfo:
    """The module's ELF facts, or LoadError(ENOEXEC) where the kernel refuses the ELF."""
    try:
        return ModInfo.from_elf(read_at, size)
    except ModuleRejected as exc:
        raise LoadError(errno.ENOEXEC, f"{fallback}: {exc.reason}") from exc


class FakeKeyring:
    """The kernel's trusted keys, as sets of key ids; records what was asked.

    ``trusted`` keys sit in ``.secondary_trusted_keys`` through ``.machine`` (MOKs, as an
    out-of-tree signer's key is on a Secure Boot host), ``builtin`` ones in
    ``.builtin_trusted_keys``, ``secondary`` ones in ``.secondary_trusted_keys`` itself (added
    at run time), ``platform`` ones in ``.platform`` (the UEFI db)."""

    def __init__(
        self,
        trusted: set[str],
        platform: set[str] | None = None,
        blacklist: set[str] | None = None,
        *,
        builtin: set[str] | None = None,
        secondary: set[str] | None = None,
    ) -> None:
        self.trusted = trusted
        self.platform = platform or set()
        self.blacklist = blacklist or set()
        self.builtin = builtin or set()
        self.secondary = secondary or set()
        self.asked: list[str] = []

    def trusts(self, key_id: str, *, platform: bool = False) -> bool:
        """Whether ``key_id`` is trusted (the platform keyring too, if asked)."""
        self.asked.append(key_id)
        held = self.trusted | self.builtin | self.secondary
        return key_id in held or (platform and key_id in self.platform)

    def blacklisted(self, sha256: str) -> bool:
        """Whether the digest is on the blacklist."""
        return sha256 in self.blacklist

    def rings(self, key_id: str) -> frozenset[str]:
        """The keyrings holding ``key_id``, by the kernel keyring reader's labels; as
        ``KEYCTL_SEARCH`` follows links, ``.secondary_trusted_keys`` holds the keys of
        ``.builtin_trusted_keys`` and ``.machine`` too."""
        self.asked.append(key_id)
        sets = (("machine", self.trusted), ("builtin", self.builtin),
                ("secondary", self.secondary | self.trusted | self.builtin),
                ("platform", self.platform))  # fmt: skip
        return frozenset(label for label, keys in sets if key_id in keys)


class FakeKernel:
    """A module loader that records its calls and answers as the kernel's does.

    * a module is named by its ELF (``struct module``'s name in
      ``.gnu.linkonce.this_module``), never by the file it came from;
    * loading a live module is EEXIST; a module whose ``depends`` are not live is ENOENT
      (an unresolved symbol);
    * ``loaded()`` shows each module's ``srcversion`` (None when its ``.modinfo`` has
      none: the kernel then creates no ``/sys/module/X/srcversion``);
    * unloading a module that others use (holders) or with references (``refcnt``) is
      EWOULDBLOCK under O_NONBLOCK; one never loaded is ENOENT;
    * ``modprobe`` loads only the in-tree modules it is told exist (``intree``: name ->
      srcversion); any other name fails as ``modprobe -a`` does, after loading the rest.

    ``fail`` maps a module (ELF) name to the errno its init returns: the module is then
    not live, as after a failing init. With ``sys`` (a sysfs tree) the kernel's view is
    kept there too, as the kernel keeps it: ``module/X/{initstate,srcversion,refcnt}`` and
    ``module/X/holders/``, so sysfs readers see what ``loaded()`` says.
    """

    def __init__(
        self,
        fail: Mapping[str, int] | None = None,
        live: Mapping[str, str | None] | None = None,
        *,
        intree: Mapping[str, str | None] | None = None,
        refcnt: Mapping[str, int] | None = None,
        sys: Path | None = None,
    ) -> None:
        self.fail = dict(fail or {})
        self.live: dict[str, str | None] = dict(live or {})
        self.intree = dict(intree or {})
        self.refcnt = dict(refcnt or {})
        self.holders: dict[str, set[str]] = {}
        self.calls: list[tuple[str, ...]] = []
        self.compressed_loads: list[int] = []  # sizes of compressed files handed over
        self.sys = sys
        for name in self.live:
            self._show(name)

    def load(self, fd: int, params: str) -> None:
        """finit_module: the module is read from ``fd`` and named by its ELF."""
        size = os.fstat(fd).st_size
        info = module_identity(lambda at, n: os.pread(fd, n, at), size, f"fd {fd}")
        self._insert(info, params)

    def load_compressed(self, fd: int, image: bytes, params: str) -> None:
        """finit_module of a compressed file the kernel decompresses to ``image``."""
        self.compressed_loads.append(os.fstat(fd).st_size)
        info = module_identity(lambda at, n: image[at : at + n], len(image), f"fd {fd}")
        self._insert(info, params)

    def load_image(self, image: bytes, name: str, params: str) -> None:
        """finit_module of a memfd called ``name``: the memfd's name plays no part."""
        info = module_identity(lambda at, n: image[at : at + n], len(image), name)
        self._insert(info, params)

    def _insert(self, info: ModInfo, params: str) -> None:
        name = normalize_module_name(info.module_name or info.name or "")
        self.calls.append(("load", name, params))
        if name in self.live:
            raise LoadError(errno.EEXIST, describe(errno.EEXIST))
        if missing := [d for d in map(normalize_module_name, info.depends) if d not in self.live]:
            raise LoadError(errno.ENOENT, f"{describe(errno.ENOENT)}: {', '.join(missing)}")
        if name in self.fail:
            raise LoadError(self.fail[name], describe(self.fail[name]))
        self.live[name] = info.srcversion
        self._show(name)
        for dep in map(normalize_module_name, info.depends):
            self.holders.setdefault(dep, set()).add(name)
            self._show(dep)

    def unload(self, name: str) -> None:
        """delete_module(name, O_NONBLOCK)."""
        self.calls.append(("unload", name))
        if name not in self.live:
            raise LoadError(errno.ENOENT, f"cannot unload {name}: {os.strerror(errno.ENOENT)}")
        if self.holders.get(name) or self.refcnt.get(name, 0) > 0:
            code = errno.EWOULDBLOCK
            raise LoadError(code, f"cannot unload {name}: {os.strerror(code)}")
        del self.live[name]
        if self.sys is not None:
            shutil.rmtree(self.sys / "module" / name)
        for dep, users in self.holders.items():
            if name in users:
                users.discard(name)
                self._show(dep)

    def _show(self, name: str) -> None:
        """Write the live module ``name`` as the kernel shows it under ``sys/module``."""
        if self.sys is None:
            return
        base = self.sys / "module" / name
        shutil.rmtree(base, ignore_errors=True)
        (base / "holders").mkdir(parents=True)
        (base / "initstate").write_text("live\n")
        users = self.holders.get(name, set())
        (base / "refcnt").write_text(f"{len(users) + self.refcnt.get(name, 0)}\n")
        if self.live[name] is not None:
            (base / "srcversion").write_text(f"{self.live[name]}\n")
        for user in users:
            (base / "holders" / user).symlink_to(self.sys / "module" / user)

    def loaded(self) -> dict[str, str | None]:
        """Live modules: name -> srcversion."""
        return dict(self.live)

    def modprobe(self, names: list[str]) -> None:
        """``modprobe -a NAMES``: live or in-tree names succeed, any other fails (ENOENT)."""
        if not names:
            return
        self.calls.append(("modprobe", *names))
        unknown = []
        for name in map(normalize_module_name, names):
            if name in self.live:
                continue
            if name in self.intree:
                self.live[name] = self.intree[name]
                self._show(name)
            else:
                unknown.append(name)
        if unknown:
            why = "; ".join(f"modprobe: FATAL: Module {n} not found" for n in unknown)
            raise LoadError(errno.ENOENT, f"modprobe {' '.join(names)} failed: {why}")


MEMORY_STATES = ("online", "online_kernel", "online_movable", "offline")
ZONES = {"online_kernel": "Normal", "online_movable": "Movable"}
FIRMWARE_PATH = "module/firmware_class/parameters/path"
FIRMWARE_PATH_SIZE = 256  # fw_path_para[256]: param_set_copystring refuses 256 bytes and more


class FakeSysfs(Sysfs):
    """sysfs over a temporary tree, with the kernel's answers for what modstage writes.

    A memory block's ``state`` reads back ``online`` or ``offline`` whatever online type
    was written (and its ``valid_zones`` names the zone); writing an unknown type, or
    onlining an online block (offlining an offline one), is EINVAL. The firmware path
    keeps the bytes up to the first NUL, reads back with a newline, and refuses 256
    bytes or more (ENOSPC). ``auto_online_blocks`` takes an online type or ``offline``
    (else EINVAL) and reads it back. Anything else is stored as written.
    """

    def write(self, attribute: str, value: str) -> bool:
        """Write ``value`` if it differs from what is there; the kernel's errors as OSError."""
        if self.read(attribute) == value:
            return False
        path = self.root / attribute
        if path.name == "state" and path.parent.parent.name == "memory":
            self._memory_state(path, value)
        elif path.name == "auto_online_blocks" and value.rstrip("\n") not in MEMORY_STATES:
            raise OSError(errno.EINVAL, os.strerror(errno.EINVAL), str(path))
        elif attribute == FIRMWARE_PATH:
            stored = value.split("\0", 1)[0]
            if len(stored.encode()) >= FIRMWARE_PATH_SIZE:
                raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(path))
            path.write_text(stored + "\n")
        else:
            path.write_text(value)
        return True

    @staticmethod
    def _memory_state(path: Path, value: str) -> None:
        wanted = value.rstrip("\n")
        now = path.read_text().strip()
        if wanted not in MEMORY_STATES or (wanted == "offline") == (now == "offline"):
            raise OSError(errno.EINVAL, os.strerror(errno.EINVAL), str(path))
        path.write_text("offline\n" if wanted == "offline" else "online\n")
        zones = path.with_name("valid_zones")
        if wanted == "offline":
            zones.write_text("Normal Movable\n")
        else:
            zones.write_text(ZONES.get(wanted, "Normal") + "\n")


def make_host(
    root: Path,
    kernel: str,
    cert: Path,
    blocks: dict[int, str] | None = None,
    source: Path = Path("/"),
) -> Layout:
    """A host tree: trusted cert, procfs facts, and a sysfs with memory and firmware_class;
    the target kernel's files are read under ``source`` (see ``install_target``)."""
    layout = Layout(root)
    layout.trusted.mkdir(parents=True)
    shutil.copy(cert, layout.trusted / cert.name)
    running_host(layout, kernel, BOOT_ID)
    install_target(root, kernel, source=source)  # the target's vermagic and config
    layout.incoming.mkdir(parents=True)
    memory = layout.sys / "devices/system/memory"
    memory.mkdir(parents=True)
    (memory / "auto_online_blocks").write_text("offline\n")
    for n, state in (blocks or {}).items():
        (memory / f"memory{n}").mkdir()
        (memory / f"memory{n}" / "state").write_text(state + "\n")
    fw = layout.sys / "module/firmware_class/parameters"
    fw.mkdir(parents=True)
    (fw / "path").write_text("\n")
    return layout


def make_intake(
    layout: Layout, config: Config | None = None, keyring: Keyring | None = None
) -> Intake:
    """An in-process intake on ``layout`` trusting its ``trusted.d``, with ``config`` (the
    defaults if none) and ``keyring`` (by default one that trusts nothing, never asked while
    the kernel does not enforce)."""
    from service.config import Config
    from service.intake.scan import Intake
    from service.verify.signature.trust import TrustStore

    return Intake(
        layout,
        config or Config(),
        TrustStore.from_directory(layout.trusted),
        keyring or FakeKeyring(set()),
    )


def pending(
    host: Layout,
    kernel: str,
    mods: list[tuple[Path, str]],
    version: str = "1",
    bundle: str = "test",
    **kw: Any,
) -> str:
    """Stage ``mods`` (file, parameters) as a bundle and take it in; the pending generation."""
    from stager.drop import ModuleSpec, stage

    stage(
        host.incoming,
        bundle=bundle,
        version=version,
        kernel=kernel,
        modules=[ModuleSpec(p, params) for p, params in mods],
        **kw,
    )
    [outcome] = make_intake(host).run()
    assert outcome.accepted, outcome.reasons
    return str(outcome.generation)


def boot_with(host: Layout, kernel: Kernel, /, **config: Any) -> Boot:
    """A boot loader on ``host`` with ``kernel`` and the fake sysfs over ``host.sys``."""
    from service.boot.loader import Boot
    from service.config import Config
    from service.verify.signature.trust import TrustStore

    trust = TrustStore.from_directory(host.trusted)
    return Boot(host, Config(**config), trust, kernel, FakeSysfs(host.sys))

"""A kernel that loads nothing: what ``--root`` other than ``/`` uses instead of the real one.

Under a sandbox root modstage must not change the machine it runs on. This
:class:`~service.host.modules.Kernel` records every ``finit_module``,
``delete_module`` and ``modprobe`` it stands in for, reads the live modules from
the sandbox's own ``sys/module`` tree, and keeps its own view of what it
"loaded", so the loader's decisions (already loaded, another version, undo on
failure) run exactly as on a host. It answers as the kernel does wherever the
answer follows from the files alone (``tests/contract`` holds it to that): a live
module's name is EEXIST, a module whose ``depends=`` are not live is ENOENT, a module
others use is EWOULDBLOCK to unload, and ``modprobe`` of a name the target's module
tree does not know is ENOENT. What only running the module tells (its init failing)
it cannot know.

With ``shows`` (a sandbox's boot, not a dry run) it also shows what it loads as the kernel
does, under the sandbox's ``sys/module/<name>``: ``initstate`` ``live``, the module's
``srcversion``, ``refcnt`` and ``holders/``; an unload removes the directory. ``status
--root`` then finds the modules a sandbox boot loaded live, as on a host.
"""

from __future__ import annotations

import errno
import os
import shutil
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

from service.errors import LoadError, ServiceError
from service.host.modules import describe, live_modules, own_fd
from service.host.sysfs import Sysfs
from stager.schema.paths import normalize_module_name


class Identity(Protocol):
    """What a module's ELF says about it (:class:`~service.verify.modinfo.ModInfo` is one)."""

    @property
    def module_name(self) -> str | None:
        """The name the kernel registers (``struct module``'s)."""

    @property
    def name(self) -> str | None:
        """``.modinfo``'s ``name=``."""

    @property
    def srcversion(self) -> str | None:
        """``.modinfo``'s ``srcversion=``."""

    @property
    def depends(self) -> tuple[str, ...]:
        """``.modinfo``'s ``depends=``: the modules whose symbols it uses."""


Identify = Callable[[Callable[[int, int], bytes], int], Identity]


@dataclass
class RecordingKernel:
    """Records kernel calls; ``sys`` is the sandbox's sysfs root.

    ``identify`` reads a module's ELF (``ModInfo.from_elf``, passed in by the command: the
    kernel layer does not import verification) so a load is recorded under the module's
    own name, as the kernel names it, with its ``depends=``; without it, the file's name
    stands in and no dependency is checked. ``modules`` is the target release's
    module tree (``lib/modules/RELEASE``): ``modprobe`` knows the names its
    ``modules.dep`` and ``modules.builtin`` list; without it, every name is taken as
    in-tree. ``shows``: write each load and unload to ``sys/module`` (see the module's
    docstring); the dry run leaves it off and writes nothing.
    """

    sys: Path
    calls: list[tuple[str, ...]] = field(default_factory=list)
    _live: dict[str, str | None] | None = None
    identify: Identify | None = None
    modules: Path | None = None
    _holders: dict[str, set[str]] = field(default_factory=dict)  # module -> its users
    _refs: dict[str, int] = field(default_factory=dict)  # references other than holders
    _intree: tuple[dict[str, tuple[str, ...]], frozenset[str]] | None = None
    shows: bool = False

    def _view(self) -> dict[str, str | None]:
        if self._live is None:
            self._live = live_modules(Sysfs(self.sys))
            self._seed_uses(self._live)
        return self._live

    def _seed_uses(self, live: dict[str, str | None]) -> None:
        """Who uses the modules live before this kernel: their ``holders/`` and ``refcnt``."""
        sysfs = Sysfs(self.sys)
        for name in live:
            users = set(sysfs.entries(f"module/{name}/holders"))
            self._holders[name] = users
            try:
                refcnt = int(sysfs.read(f"module/{name}/refcnt"))
            except (OSError, ValueError):
                refcnt = len(users)
            self._refs[name] = max(refcnt - len(users), 0)

    def load(self, fd: int, params: str) -> None:
        """Record the module file (by this process's own descriptor) and its parameters."""
        path = os.readlink(own_fd(fd))  # names the store file the loader opened
        self.calls.append(("finit_module", path, params))
        self._record(Path(path).name, lambda at, n: os.pread(fd, n, at), os.fstat(fd).st_size)

    def load_compressed(self, fd: int, image: bytes, params: str) -> None:
        """Record the compressed file handed to the kernel (it would decompress it to
        ``image``)."""
        path = os.readlink(own_fd(fd))
        self.calls.append(("finit_module", path, params))
        self._record(Path(path).name, lambda at, n: image[at : at + n], len(image))

    def load_image(self, image: bytes, name: str, params: str) -> None:
        """Record a decompressed image's load (from a memfd named ``name``, flags 0)."""
        self.calls.append(("finit_module", f"memfd:{name}", params))
        self._record(name, lambda at, n: image[at : at + n], len(image))

    def _record(self, file: str, read_at: Callable[[int, int], bytes], size: int) -> None:
        """The module is live under its ELF name (the file's name without ``identify``).

        As the kernel: a live name is EEXIST, a ``depends=`` module not live is ENOENT
        (an unresolved symbol), and each dependency gains the module as a holder.
        """
        name, srcversion = file.split(".", 1)[0], None
        depends: tuple[str, ...] = ()
        if self.identify is not None:
            try:
                info = self.identify(read_at, size)
            except ServiceError as exc:  # the kernel refuses an ELF it cannot read
                raise LoadError(errno.ENOEXEC, f"{file}: {exc}") from exc
            name, srcversion = info.module_name or info.name or name, info.srcversion
            depends = tuple(normalize_module_name(d) for d in info.depends if d)
        name, live = normalize_module_name(name), self._view()
        if name in live:
            raise LoadError(errno.EEXIST, describe(errno.EEXIST))
        if missing := [d for d in depends if d not in live]:
            raise LoadError(errno.ENOENT, f"{describe(errno.ENOENT)}: {', '.join(missing)}")
        live[name] = srcversion
        self._show(name)
        for dep in depends:
            self._holders.setdefault(dep, set()).add(name)
            self._show(dep)

    def unload(self, name: str) -> None:
        """Record the unload; a module this kernel never saw is ENOENT, one in use is
        EWOULDBLOCK (``O_NONBLOCK``), as on a host."""
        self.calls.append(("delete_module", name))
        live = self._view()
        if name not in live:
            raise LoadError(errno.ENOENT, f"cannot unload {name}: not loaded")
        if self._holders.get(name) or self._refs.get(name, 0) > 0:
            code = errno.EWOULDBLOCK
            raise LoadError(code, f"cannot unload {name}: {os.strerror(code)}")
        del live[name]
        self._holders.pop(name, None)
        self._refs.pop(name, None)
        if self.shows:
            shutil.rmtree(self.sys / "module" / name, ignore_errors=True)
        for dep, users in self._holders.items():
            if name in users:
                users.discard(name)
                self._show(dep)

    def loaded(self) -> dict[str, str | None]:
        """The sandbox's live modules plus what this kernel recorded as loaded."""
        return dict(self._view())

    def modprobe(self, names: list[str]) -> None:
        """Record ``modprobe -a NAMES``: each name the module tree knows is loaded with its
        own dependencies (a built-in one needs nothing); any other is ENOENT, after the rest.
        """
        if not names:
            return
        self.calls.append(("modprobe", *names))
        live = self._view()
        if self.modules is None:
            for name in map(normalize_module_name, names):
                live.setdefault(name, None)
            return
        deps, builtin = self._in_tree()
        unknown = []
        for name in map(normalize_module_name, names):
            if name in live or name in builtin:
                continue
            if name not in deps:
                unknown.append(name)
                continue
            for module in (*reversed(deps[name]), name):  # modules.dep lists the deepest last
                if module not in live:
                    live[module] = None
                    self._show(module)
        if unknown:
            why = "; ".join(f"modprobe: FATAL: Module {n} not found" for n in unknown)
            raise LoadError(errno.ENOENT, f"modprobe {' '.join(names)} failed: {why}")

    def _show(self, name: str) -> None:
        """Write live module ``name`` under ``sys/module/<name>`` as the kernel shows it:
        ``initstate``, ``srcversion`` (where its ``.modinfo`` has one), ``refcnt`` (its
        holders and other references) and ``holders/<user>`` links; nothing without
        ``shows``."""
        if not self.shows:
            return
        base = self.sys / "module" / name
        holders = base / "holders"
        users = self._holders.get(name, set())
        srcversion = self._view().get(name)
        try:
            holders.mkdir(parents=True, exist_ok=True)
            (base / "initstate").write_text("live\n")
            if srcversion:
                (base / "srcversion").write_text(f"{srcversion}\n")
            (base / "refcnt").write_text(f"{len(users) + self._refs.get(name, 0)}\n")
            for link in holders.iterdir():
                if link.name not in users:
                    link.unlink()
            for user in users - {p.name for p in holders.iterdir()}:
                (holders / user).symlink_to(f"../../{user}")
        except OSError as exc:
            code = exc.errno or errno.EIO
            raise LoadError(code, f"cannot show {name} under {base}: {exc.strerror}") from exc

    def _in_tree(self) -> tuple[dict[str, tuple[str, ...]], frozenset[str]]:
        """``modules.dep`` (module -> its dependencies) and ``modules.builtin``, by name."""
        if self._intree is None:
            assert self.modules is not None
            deps: dict[str, tuple[str, ...]] = {}
            for line in _lines(self.modules / "modules.dep"):
                module, _, needs = line.partition(":")
                deps[_module_name(module)] = tuple(map(_module_name, needs.split()))
            builtin = frozenset(map(_module_name, _lines(self.modules / "modules.builtin")))
            self._intree = (deps, builtin)
        return self._intree


def _lines(path: Path) -> list[str]:
    """The non-empty lines of a module list; none when it is absent (modprobe then finds
    nothing, as it finds nothing without ``depmod``)."""
    try:
        return [line for line in path.read_text().splitlines() if line.strip()]
    except FileNotFoundError:
        return []


def _module_name(path: str) -> str:
    """``kernel/lib/ts_kmp.ko.xz`` -> ``ts_kmp``, as modprobe names a module file."""
    return normalize_module_name(path.rsplit("/", 1)[-1].split(".ko", 1)[0])

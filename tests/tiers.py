"""What a test needs of the machine, read from its code: the ``kbuild`` and ``root`` markers.

A test needs ``kbuild`` (Debian's kernel packages: the headers and kbuild under ``/usr/src``,
gcc and make, ``sign-file``, the installed kernel's ``/lib/modules`` and ``/boot`` files) when
its function, or a fixture in its closure, refers to one of :data:`KBUILD` (tests/kmod's
entry points that read those files), directly or through any function or class of the test
tree that refers to one. It needs ``root`` when that code runs a command only root may
(:data:`ROOT_COMMANDS`) or calls a call only root may (:data:`ROOT_CALLS`). The reading is
of names, not of calls: a test that names such a helper without calling it is marked too
(it lands in the slower tier, never in the fast one with a need it does not meet). A test
that reads those files without tests/kmod carries ``@pytest.mark.kbuild`` by hand.

``tests/conftest.py`` marks every collected test from here. The fast tier, ``tests/fast``,
leaves out these two, ``debian`` and ``vm`` (set by hand on the files that need them) and
``fuzz`` (README.md).
"""

from __future__ import annotations

import importlib
import inspect
import types
from collections.abc import Callable, Iterator
from typing import Any

import tests.kmod.build
import tests.kmod.keys
import tests.kmod.target

#: tests/kmod's entry points that read Debian's kernel packages or run their tools
KBUILD: frozenset[object] = frozenset(
    {
        tests.kmod.build.kernel_release,  # /usr/src/linux-headers-*, /lib/modules
        tests.kmod.build.kbuild,  # make against the headers, gcc
        tests.kmod.build.build_once,
        tests.kmod.build.build_modules,
        tests.kmod.build.padded_module,
        tests.kmod.keys.sign,  # /usr/lib/linux-kbuild-6.1/scripts/sign-file
        tests.kmod.keys.SIGN_FILE,
        tests.kmod.keys.debian_build_cert,  # /boot/vmlinuz-*
        tests.kmod.target.install_target,  # /lib/modules/<release>, /boot/config-*
    }
)
#: commands a test runs that only root may: mounts, namespaces, chroot
ROOT_COMMANDS = frozenset({"mount", "umount", "unshare", "chroot", "nsenter"})
#: calls a test makes that only root may
ROOT_CALLS = frozenset({"setuid", "setgid", "setgroups", "chown", "lchown", "chroot", "mknod"})


def _codes(code: types.CodeType) -> Iterator[types.CodeType]:
    """``code`` and every function, lambda or comprehension defined inside it."""
    yield code
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            yield from _codes(const)


def _ours(obj: object) -> bool:
    """Whether ``obj`` is a function or class of the test tree (followed further)."""
    module = getattr(obj, "__module__", None) or ""
    return module == "tests" or module.startswith("tests.")


class Needs:
    """Reads what code needs; each function or class is read once per session."""

    def __init__(self) -> None:
        self._seen: dict[object, frozenset[str]] = {}
        self._open: set[object] = set()  # being read: a cycle back to one is cut there
        self._cut = False

    def of(self, obj: object) -> frozenset[str]:
        """The markers ``obj`` (a function, method or class) needs, through what it refers to."""
        key = obj if isinstance(obj, type) else getattr(obj, "__code__", obj)
        try:
            if key in self._seen:
                return self._seen[key]
        except TypeError:  # unhashable: nothing of ours
            return frozenset()
        if key in self._open:
            self._cut = True
            return frozenset()
        self._open.add(key)
        outer, self._cut = self._cut, False
        found = frozenset(self._read(obj))
        self._open.discard(key)
        if not self._cut or not self._open:  # a reading cut short by a cycle is not kept
            self._seen[key] = found
        self._cut = self._cut or outer
        return found

    def _read(self, obj: object) -> Iterator[str]:
        if isinstance(obj, type):
            for member in vars(obj).values():
                if isinstance(member, staticmethod | classmethod):
                    member = member.__func__
                if isinstance(member, property):
                    member = member.fget
                if inspect.isfunction(member):
                    yield from self.of(member)
            return
        func = inspect.unwrap(obj) if callable(obj) else obj  # type: ignore[arg-type]
        code = getattr(func, "__code__", None)
        if code is None:
            return
        scope: dict[str, Any] = getattr(func, "__globals__", {})
        for inner in _codes(code):
            yield from self._code(inner, scope)

    def _code(self, code: types.CodeType, scope: dict[str, Any]) -> Iterator[str]:
        strings = [c for c in code.co_consts if isinstance(c, str)]
        if any(c in ROOT_COMMANDS for c in strings):
            yield "root"
        names = code.co_names
        if any(n in ROOT_CALLS for n in names) and {"os", "shutil"} & set(names):
            yield "root"
        for referred in self._referred(names, scope):
            if _hashable_in(referred, KBUILD):
                yield "kbuild"
            elif _ours(referred) and (inspect.isfunction(referred) or isinstance(referred, type)):
                yield from self.of(referred)

    @staticmethod
    def _referred(names: tuple[str, ...], scope: dict[str, Any]) -> Iterator[object]:
        """The objects ``names`` reach from ``scope``: a global, or an attribute of a module of
        the test tree the code names (``kmod.sign``) or imports in its body."""
        modules = [scope[n] for n in names if isinstance(scope.get(n), types.ModuleType)]
        modules += [_module(n) for n in names if n.startswith("tests.")]
        ours = [m for m in modules if m is not None and _ours_module(m)]
        for name in names:
            if name in scope:
                yield scope[name]
            for module in ours:
                attr = getattr(module, name, None)
                if attr is not None:
                    yield attr


def _module(name: str) -> types.ModuleType | None:
    """The test tree's module ``name`` (imported now if a function imports it when run)."""
    try:
        return importlib.import_module(name)
    except ImportError:
        return None


def _ours_module(module: types.ModuleType) -> bool:
    return module.__name__ == "tests" or module.__name__.startswith("tests.")


def _hashable_in(obj: object, group: frozenset[object]) -> bool:
    try:
        return obj in group
    except TypeError:
        return False


def item_needs(needs: Needs, function: Callable[..., object], fixtures: list[Any]) -> set[str]:
    """The markers a test needs: its function's and every fixture's in its closure."""
    found = set(needs.of(function))
    for fixturedef in fixtures:
        found |= needs.of(fixturedef.func)
    return found

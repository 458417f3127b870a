"""The hostile-drop catalogue: every way a container might trick the host, and the reason given.

For each case: the drop is rejected with exactly the expected reason, the intake
finishes (a planted FIFO or device cannot block it), no file outside the drop is
opened or read (inotify ``IN_OPEN | IN_ACCESS`` on a canary directory and on
``/etc/shadow``), no FIFO, device node or socket planted in the drop is opened
(the same watch on each planted node: only ``O_PATH``, which reports nothing, may
reach it), and another bundle's state, status and store stay byte-for-byte as
they were.
"""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import stat
import threading
import time
import tomllib
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path

import pytest
import tomli_w

from service.config import BundlePolicy, Config, Limits
from service.layout import Layout
from service.store.intake import Outcome
from service.store.phase import Phase
from service.store.state import Generation
from service.store.statefile import load, save
from stager.manifest import MemoryPolicy
from stager.paths import MANIFEST_NAME
from tests.hardening.conftest import make_intake, stage_drop
from tests.hardening.watch import AccessWatch, special_files
from tests.kmod import SigningKey, sign

M = "modules/ms_exporter.ko"
F = "firmware/fw/blob.bin"
SHADOW = Path("/etc/shadow")
NOTDIR = "a directory on its path is not a directory (or is a symbolic link)"


@dataclass
class Ctx:
    """A freshly staged good drop (``M`` and ``F``) and a directory outside it."""

    drop: Path
    outside: Path
    layout: Layout
    signed: dict[str, Path]
    kernel: str
    untrusted: Path  # ms_exporter signed by a key nobody trusts
    unsigned: Path

    @property
    def d(self) -> str:
        return str(self.drop)

    @property
    def m(self) -> str:
        return f"{self.drop}/manifest.toml"

    def manifest(self) -> dict[str, object]:
        return tomllib.loads((self.drop / MANIFEST_NAME).read_text())

    def rewrite(self, data: dict[str, object] | bytes) -> None:
        raw = data if isinstance(data, bytes) else tomli_w.dumps(data).encode()
        (self.drop / MANIFEST_NAME).unlink()
        (self.drop / MANIFEST_NAME).write_bytes(raw)

    def set_file(self, key: str, path: str) -> None:
        data = self.manifest()
        data[key][0]["file"] = path  # type: ignore[index]
        self.rewrite(data)

    def replace_with(self, rel: str, make: Callable[[Path], object]) -> None:
        target = self.drop / rel
        if target.is_dir() and not target.is_symlink():
            shutil.rmtree(target)
        else:
            target.unlink()
        make(target)


Plant = Callable[[Ctx], list[str | re.Pattern[str]]]


def _sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _mknod(kind: int, major: int, minor: int) -> Callable[[Path], None]:
    return lambda p: os.mknod(p, kind | 0o600, os.makedev(major, minor))


def _moved_out(ctx: Ctx, rel: str) -> Path:
    out = ctx.outside / f"moved-{rel.replace('/', '_')}"
    shutil.move(ctx.drop / rel, out)
    return out


def _drop_is_symlink(ctx: Ctx) -> list[str | re.Pattern[str]]:
    real = ctx.outside / "real-drop"
    shutil.move(ctx.drop, real)
    ctx.drop.symlink_to(real)
    return [f"{ctx.d}: is a symbolic link"]


def _renamed(ctx: Ctx) -> list[str | re.Pattern[str]]:
    new = ctx.drop.with_name("evil" + ctx.drop.name[4:])
    ctx.drop.rename(new)
    ctx.drop = new
    return [f"{new}: directory is named for bundle 'evil' but its manifest is for 'test'"]


def _swap(ctx: Ctx, rel: str, data: bytes) -> list[str | re.Pattern[str]]:
    expected = next(
        e["sha256"]
        for key in ("module", "firmware")
        for e in ctx.manifest().get(key, [])  # type: ignore[attr-defined]
        if e["file"] == rel
    )
    ctx.replace_with(rel, lambda p: p.write_bytes(data))
    actual = hashlib.sha256(data).hexdigest()
    return [f"{ctx.d}/{rel}: EBADMSG: sha256 {actual} is not the manifest's {expected}"]


def _bad_path(key: str, path: str, why: str) -> Plant:
    def plant(ctx: Ctx) -> list[str | re.Pattern[str]]:
        ctx.set_file(key, path)
        return [f"{ctx.m}: {key}[0].file: {why}"]

    return plant


def _toml(raw: bytes, why: str | re.Pattern[str]) -> Plant:
    def plant(ctx: Ctx) -> list[str | re.Pattern[str]]:
        ctx.rewrite(raw)
        if isinstance(why, re.Pattern):
            return [re.compile(re.escape(f"{ctx.m}: ") + why.pattern)]
        return [f"{ctx.m}: {why}"]

    return plant


def _toml_error(raw: bytes) -> str:
    try:
        tomllib.loads(raw.decode())
    except tomllib.TOMLDecodeError as exc:
        return f"not valid TOML: {exc}"
    raise AssertionError("the case's TOML is valid")


def _with_state(ctx: Ctx, change: Callable[[Ctx, str], Generation | None], phase: Phase) -> None:
    from stager.manifest import Manifest

    digest = Manifest.from_toml((ctx.drop / MANIFEST_NAME).read_bytes()).digest
    state = load(ctx.layout.state)
    gen = change(ctx, digest)
    b = state.bundle("test")
    if gen is not None:
        b = b.with_generation(gen)
    save(ctx.layout.state, state.with_bundle("test", replace(b, phase=phase)))


def _failed_before(ctx: Ctx) -> list[str | re.Pattern[str]]:
    digest = ""

    def change(c: Ctx, d: str) -> Generation:
        nonlocal digest
        digest = d
        return Generation(d, "1", c.kernel, failed="ENODEV: boom")

    _with_state(ctx, change, Phase.ACTIVE)
    return [f"generation {digest[:12]} already failed: ENODEV: boom"]


def _loading(ctx: Ctx) -> list[str | re.Pattern[str]]:
    _with_state(ctx, lambda c, d: None, Phase.LOADING)
    return ["bundle 'test' is being loaded; drop it again after boot"]


def _deep(n: int) -> str:
    return "/".join(["d"] * n) + "/x.ko"


_NESTED_ARRAYS = b"schema = 1\na = " + b"[" * 300_000 + b"]" * 300_000 + b"\n"
_NESTED_TABLES = b"schema = 1\na = " + b"{b=" * 100_000 + b"1" + b"}" * 100_000 + b"\n"
_RECURSION = re.compile(r"not valid TOML: maximum recursion depth exceeded.*")
_BAD_SYNTAX = b"schema = 1\nbundle = \n"
_DUPLICATE = b'schema = 1\nschema = 1\nbundle = "test"\n'
_MISSING = (
    "schema: missing; bundle: missing; version: missing; kernel: missing; "
    "module: missing (a bundle loads at least one module)"
)


def _tables(key: str, n: int) -> Plant:
    def plant(ctx: Ctx) -> list[str | re.Pattern[str]]:
        data = ctx.manifest()
        entry = data[key][0]  # type: ignore[index]
        data[key] = [
            {
                **entry,
                "file": f"{entry['file'].rsplit('/', 1)[0]}/f{i}.{'ko' if key == 'module' else 'bin'}",
            }
            for i in range(n)
        ]
        ctx.rewrite(data)
        return [f"{ctx.m}: {key}: more than {n - 1} entries"]

    return plant


def _huge(ctx: Ctx) -> list[str | re.Pattern[str]]:
    raw = (ctx.drop / MANIFEST_NAME).read_bytes()
    raw += b"#" * ((1 << 20) + 1 - len(raw) - 1) + b"\n"
    ctx.rewrite(raw)
    return [f"{ctx.d}/manifest.toml: is {1 << 20 | 1} bytes, over the limit of {1 << 20}"]


def _sparse(rel: str, size: int, limit: int) -> Plant:
    def plant(ctx: Ctx) -> list[str | re.Pattern[str]]:
        os.truncate(ctx.drop / rel, size)
        return [f"{ctx.d}/{rel}: is {size} bytes, over the limit of {limit}"]

    return plant


@dataclass(frozen=True)
class Case:
    """One hostile drop: how to plant it, and the host policy it meets."""

    id: str
    plant: Plant
    config: Config = field(default_factory=Config)


def _sym(rel: str, target: Callable[[Ctx], str | Path]) -> Case:
    def plant(ctx: Ctx) -> list[str | re.Pattern[str]]:
        ctx.replace_with(rel, lambda p: p.symlink_to(target(ctx)))
        return [f"{ctx.d}/{rel}: is a symbolic link"]

    return Case(
        f"symlink-{rel.split('/')[0]}-{target.__name__ if hasattr(target, '__name__') else ''}",
        plant,
    )


def _kind(case_id: str, rel: str, make: Callable[[Path], object], why: str) -> Case:
    def plant(ctx: Ctx) -> list[str | re.Pattern[str]]:
        ctx.replace_with(rel, make)
        return [f"{ctx.d}/{rel}: {why}"]

    return Case(case_id, plant)


def _hardlink(case_id: str, rel: str) -> Case:
    def plant(ctx: Ctx) -> list[str | re.Pattern[str]]:
        out = _moved_out(ctx, rel)
        os.link(out, ctx.drop / rel)
        return [f"{ctx.d}/{rel}: has 2 hard links (a drop file must have one)"]

    return Case(case_id, plant)


def _dir_symlink(case_id: str, rel_dir: str, file: str) -> Case:
    def plant(ctx: Ctx) -> list[str | re.Pattern[str]]:
        out = _moved_out(ctx, rel_dir)
        ctx.drop.joinpath(rel_dir).symlink_to(out)
        return [f"{ctx.d}/{file}: {NOTDIR}"]

    return Case(case_id, plant)


def _canary(ctx: Ctx) -> Path:
    return ctx.outside / "canary.ko"


def _shadow(ctx: Ctx) -> Path:
    return SHADOW


def _dangling(ctx: Ctx) -> Path:
    return ctx.outside / "nothing-here"


def _self(ctx: Ctx) -> str:
    return "ms_exporter.ko"


def _outside_dir(ctx: Ctx) -> Path:
    return ctx.outside


def _relative_escape(ctx: Ctx) -> str:
    depth = len(ctx.drop.relative_to(ctx.outside.parent).parts) + 1
    return "../" * depth + "outside/canary.ko"


def _two_loop(ctx: Ctx) -> list[str | re.Pattern[str]]:
    ctx.replace_with(M, lambda p: p.symlink_to("loop.ko"))
    (ctx.drop / "modules/loop.ko").symlink_to("ms_exporter.ko")
    return [f"{ctx.d}/{M}: is a symbolic link"]


def _inner_hardlink(ctx: Ctx) -> list[str | re.Pattern[str]]:
    os.link(ctx.drop / M, ctx.drop / "modules/unlisted.ko")
    return [f"{ctx.d}/{M}: has 2 hard links (a drop file must have one)"]


def _manifest_kind(case_id: str, make: Callable[[Path], object], why: str) -> Case:
    def plant(ctx: Ctx) -> list[str | re.Pattern[str]]:
        _moved_out(ctx, MANIFEST_NAME)
        make(ctx.drop / MANIFEST_NAME)
        return [f"{ctx.m}: {why}"]

    return Case(case_id, plant)


def _manifest_link(ctx: Ctx) -> list[str | re.Pattern[str]]:
    out = _moved_out(ctx, MANIFEST_NAME)
    (ctx.drop / MANIFEST_NAME).symlink_to(out)
    return [f"{ctx.m}: is a symbolic link"]


def _manifest_hardlink(ctx: Ctx) -> list[str | re.Pattern[str]]:
    out = _moved_out(ctx, MANIFEST_NAME)
    os.link(out, ctx.drop / MANIFEST_NAME)
    return [f"{ctx.m}: has 2 hard links (a drop file must have one)"]


def _total(ctx: Ctx) -> list[str | re.Pattern[str]]:
    os.truncate(ctx.drop / F, 3 << 20)
    left = (3 << 20) - (ctx.drop / M).stat().st_size
    return [
        f"{ctx.d}/{F}: is {3 << 20} bytes, over the {left} bytes left "
        f"of the drop's total limit of {3 << 20}"
    ]


def _module_source(name: str) -> Callable[[Ctx], list[str | re.Pattern[str]]]:
    def plant(ctx: Ctx) -> list[str | re.Pattern[str]]:
        return _swap(ctx, M, ctx.signed[name].read_bytes())

    return plant


def _policy(reasons: list[str], memory: str | None = None, params: str = "") -> Plant:
    def plant(ctx: Ctx) -> list[str | re.Pattern[str]]:
        data = ctx.manifest()
        if memory:
            data["memory"] = {"auto_online_blocks": memory}
        data["module"][0]["params"] = params  # type: ignore[index]
        ctx.rewrite(data)
        return list(reasons)

    return plant


def _restage(kind: str) -> Plant:
    """Replace the drop by one staged from another module source (same drop name)."""

    def plant(ctx: Ctx) -> list[str | re.Pattern[str]]:
        source = ctx.untrusted if kind == "untrusted" else ctx.unsigned
        data = ctx.manifest()
        ctx.replace_with(M, lambda p: shutil.copyfile(source, p))
        data["module"][0]["sha256"] = _sha(source)  # type: ignore[index]
        ctx.rewrite(data)
        if kind == "untrusted":
            return [
                re.compile(
                    re.escape(f"{ctx.d}/{M}: ENOKEY: no trusted certificate has key id ")
                    + "[0-9a-f]+"
                )
            ]
        return [f"{ctx.d}/{M}: ENODATA: module is unsigned (no signature marker)"]

    return plant


def _other_kernel(ctx: Ctx) -> list[str | re.Pattern[str]]:
    data = ctx.manifest()
    data["kernel"] = "6.12.0-1-amd64"
    ctx.rewrite(data)
    # that kernel's tree, bare: without one the drop waits (deferred), it is not judged
    ctx.layout.modules_dir("6.12.0-1-amd64").mkdir(parents=True)
    return [
        f"{ctx.d}/{M}: ENOEXEC (policy): vermagic is for kernel {ctx.kernel}, not 6.12.0-1-amd64; "
        "without the target's config it is not known whether the kernel has modversions (then "
        "same_magic skips the release) or compares the whole vermagic"
    ]


def _host_provides(ctx: Ctx) -> list[str | re.Pattern[str]]:
    ours = ctx.layout.root / "lib/firmware" / F.removeprefix("firmware/")
    ours.parent.mkdir(parents=True)
    ours.write_bytes(b"the host's own firmware")
    return [
        f"{F}: the host provides /lib/firmware/{F.removeprefix('firmware/')}; "
        "[bundles.test] firmware_override does not name it"
    ]


#: the host's policy with no firmware allowed beyond the modules' declarations
NO_FIRMWARE = Config(bundles=(("test", BundlePolicy()),))

CASES = [
    # firmware that is not the bundle's own (ms_exporter declares none)
    Case(
        "firmware-undeclared",
        lambda ctx: [
            f"{F}: not declared by any module of the drop (MODULE_FIRMWARE) "
            "and not in [bundles.test] firmware"
        ],
        NO_FIRMWARE,
    ),
    Case("firmware-the-host-provides", _host_provides),
    # symbolic links
    _sym(M, _canary),
    _sym(M, _shadow),
    _sym(M, _dangling),
    _sym(M, _self),
    _sym(M, _outside_dir),
    _sym(M, _relative_escape),
    Case("symlink-loop-of-two", _two_loop),
    _sym(F, _canary),
    _sym(F, _shadow),
    _dir_symlink("symlink-modules-dir", "modules", M),
    _dir_symlink("symlink-firmware-dir", "firmware", F),
    _dir_symlink("symlink-firmware-subdir", "firmware/fw", F),
    Case("symlink-manifest", _manifest_link),
    Case("symlink-drop-dir", _drop_is_symlink),
    # hard links
    _hardlink("hardlink-module-outside", M),
    _hardlink("hardlink-firmware-outside", F),
    Case("hardlink-manifest-outside", _manifest_hardlink),
    Case("hardlink-inside-drop", _inner_hardlink),
    # FIFOs, sockets, devices, directories, missing files
    _kind("fifo-module", M, os.mkfifo, "is a FIFO, not a regular file"),
    _kind("fifo-firmware", F, os.mkfifo, "is a FIFO, not a regular file"),
    _manifest_kind("fifo-manifest", os.mkfifo, "is a FIFO, not a regular file"),
    Case(
        "fifo-as-modules-dir",
        lambda ctx: (ctx.replace_with("modules", os.mkfifo), [f"{ctx.d}/{M}: {NOTDIR}"])[1],
    ),
    _kind("socket-module", M, _mknod(stat.S_IFSOCK, 0, 0), "is a socket, not a regular file"),
    _manifest_kind(
        "socket-manifest", _mknod(stat.S_IFSOCK, 0, 0), "is a socket, not a regular file"
    ),
    _kind(
        "chardev-null-module", M, _mknod(stat.S_IFCHR, 1, 3), "is a device node, not a regular file"
    ),
    _kind(
        "chardev-zero-module", M, _mknod(stat.S_IFCHR, 1, 5), "is a device node, not a regular file"
    ),
    _kind(
        "chardev-full-firmware",
        F,
        _mknod(stat.S_IFCHR, 1, 7),
        "is a device node, not a regular file",
    ),
    _kind(
        "blockdev-loop-module",
        M,
        _mknod(stat.S_IFBLK, 7, 0),
        "is a device node, not a regular file",
    ),
    _manifest_kind(
        "chardev-zero-manifest", _mknod(stat.S_IFCHR, 1, 5), "is a device node, not a regular file"
    ),
    _kind("directory-as-module", M, os.mkdir, "is a directory, not a regular file"),
    _manifest_kind("directory-as-manifest", os.mkdir, "is a directory, not a regular file"),
    _kind("missing-module", M, lambda p: None, "does not exist"),
    _kind("missing-firmware", F, lambda p: None, "does not exist"),
    # sizes and counts
    Case("sparse-module-3GiB", _sparse(M, 3 << 30, 2 << 30)),
    Case(
        "sparse-firmware-over-config",
        _sparse(F, 2 << 20, 1 << 20),
        Config(limits=Limits(max_file_bytes=1 << 20)),
    ),
    Case("total-bytes-over-config", _total, Config(limits=Limits(max_total_bytes=3 << 20))),
    Case("sparse-manifest-2MiB", _sparse(MANIFEST_NAME, 2 << 20, 1 << 20)),
    Case("huge-manifest-1MiB+1", _huge),
    Case(
        "files-over-config",
        lambda ctx: [f"{ctx.d}: names 2 files, over the limit of 1"],
        Config(limits=Limits(max_files=1)),
    ),
    Case("firmware-4097-entries", _tables("firmware", 4097)),
    Case("module-257-entries", _tables("module", 257)),
    # names
    Case(
        "path-deeper-than-16",
        _bad_path("module", _deep(16), f"{_deep(16)!r} is deeper than 16 components"),
    ),
    Case(
        "path-dotdot",
        _bad_path(
            "module",
            "modules/../../../outside/canary.ko",
            "'modules/../../../outside/canary.ko' contains '..'",
        ),
    ),
    Case(
        "path-dotdot-firmware",
        _bad_path(
            "firmware", "firmware/../../etc/shadow", "'firmware/../../etc/shadow' contains '..'"
        ),
    ),
    Case("path-absolute", _bad_path("module", "/etc/shadow.ko", "'/etc/shadow.ko' is absolute")),
    Case(
        "path-newline",
        _bad_path(
            "module",
            "modules/a\nb.ko",
            "'modules/a\\nb.ko' contains a control character or backslash",
        ),
    ),
    Case(
        "path-nul",
        _bad_path(
            "module",
            "modules/a\x00.ko",
            "'modules/a\\x00.ko' contains a control character or backslash",
        ),
    ),
    Case(
        "path-backslash",
        _bad_path(
            "module", "modules\\x.ko", "'modules\\\\x.ko' contains a control character or backslash"
        ),
    ),
    Case(
        "path-hidden",
        _bad_path(
            "module",
            "modules/.x.ko",
            "'modules/.x.ko' has a hidden component (names starting with '.' are reserved)",
        ),
    ),
    Case(
        "path-empty-component",
        _bad_path(
            "module", "modules//x.ko", "'modules//x.ko' is not normalized (empty or '.' component)"
        ),
    ),
    Case(
        "path-dot-component",
        _bad_path(
            "module",
            "./modules/x.ko",
            "'./modules/x.ko' is not normalized (empty or '.' component)",
        ),
    ),
    Case(
        "path-long-component",
        _bad_path(
            "module",
            "modules/" + "a" * 253 + ".ko",
            f"{'modules/' + 'a' * 253 + '.ko'!r} has a component longer than 255 bytes",
        ),
    ),
    Case(
        "path-over-1024",
        _bad_path("module", "m/" + "a" * 1030 + ".ko", "is longer than 1024 bytes"),
    ),
    Case("path-empty", _bad_path("module", "", "is empty")),
    Case(
        "path-firmware-outside-firmware",
        _bad_path("firmware", "modules/x.bin", "'modules/x.bin' is not under 'firmware/'"),
    ),
    # the manifest's bytes
    Case(
        "manifest-not-utf8",
        _toml(b"schema = 1\n\xff\xfe\n", "not UTF-8 (invalid start byte at byte 11)"),
    ),
    Case("manifest-nested-arrays", _toml(_NESTED_ARRAYS, _RECURSION)),
    Case("manifest-nested-tables", _toml(_NESTED_TABLES, _RECURSION)),
    Case("manifest-bad-syntax", _toml(_BAD_SYNTAX, _toml_error(_BAD_SYNTAX))),
    Case("manifest-duplicate-key", _toml(_DUPLICATE, _toml_error(_DUPLICATE))),
    Case("manifest-empty", _toml(b"", _MISSING)),
    Case(
        "manifest-unknown-key",
        lambda ctx: (
            ctx.rewrite({**ctx.manifest(), "exec": "/bin/sh"}),
            [f"{ctx.m}: exec: unknown key"],
        )[1],
    ),
    Case(
        "manifest-schema-2",
        lambda ctx: (
            ctx.rewrite({**ctx.manifest(), "schema": 2}),
            [f"{ctx.m}: schema: unknown schema 2 (this modstage reads schema 1)"],
        )[1],
    ),
    Case(
        "manifest-module-not-array",
        lambda ctx: (
            ctx.rewrite({**ctx.manifest(), "module": "x"}),
            [f"{ctx.m}: module: must be an array of tables, not a string"],
        )[1],
    ),
    # content changed after the manifest was written
    Case("swapped-module-other-signed", _module_source("ms_params")),
    Case(
        "swapped-firmware-same-size",
        lambda ctx: _swap(ctx, F, b"X" * (ctx.drop / F).stat().st_size),
    ),
    Case("truncated-module", lambda ctx: _swap(ctx, M, (ctx.drop / M).read_bytes()[:4096])),
    Case("grown-module", lambda ctx: _swap(ctx, M, (ctx.drop / M).read_bytes() + b"\0")),
    # signatures and kernels
    Case("untrusted-signer", _restage("untrusted")),
    Case("unsigned-module", _restage("unsigned")),
    Case("other-kernel", _other_kernel),
    # host policy
    Case(
        "bundle-not-allowed",
        _policy(["bundle 'test' is not allowed on this host"]),
        Config(allowed_bundles=("nvidia",)),
    ),
    Case(
        "param-forbidden",
        _policy(
            ["module[0].params: 'NVreg_Debug' is forbidden on this host"], params="NVreg_Debug=1"
        ),
        Config(forbidden_params=("NVreg_Debug",)),
    ),
    Case(
        "param-forbidden-dash-spelling",
        _policy(
            ["module[0].params: 'NVreg-Debug' is forbidden on this host"], params="a=1 NVreg-Debug"
        ),
        Config(forbidden_params=("NVreg_Debug",)),
    ),
    Case(
        "memory-policy-forbidden",
        _policy(
            ["memory policy 'online_movable' is not allowed on this host"], memory="online_movable"
        ),
        Config(allowed_memory_policies=(MemoryPolicy.OFFLINE,)),
    ),
    Case("drop-named-for-another-bundle", _renamed),
    Case("generation-failed-before", _failed_before),
    Case("bundle-being-loaded", _loading),
]


def _run_intake(layout: Layout, config: Config, timeout: float = 30.0) -> list[Outcome]:
    """Run one intake in a thread; fail if it does not return within ``timeout``."""
    result: list[list[Outcome]] = []
    thread = threading.Thread(target=lambda: result.append(make_intake(layout, config).run()))
    thread.daemon = True
    thread.start()
    thread.join(timeout)
    assert not thread.is_alive(), "intake blocked"
    return result[0]


def _watch(outside: Path) -> AccessWatch:
    """Watch every directory and file outside the drop (a file watch follows its inode,
    so it also sees an open through a hard link planted in the drop)."""
    paths = [Path(d) / n for d, dirs, files in os.walk(outside) for n in [".", *dirs, *files]]
    return AccessWatch([*paths, SHADOW])


def _watch_nodes(incoming: Path) -> AccessWatch:
    """Watch every FIFO, device node and socket planted in the incoming directory."""
    return AccessWatch(special_files(incoming))


def _snapshot(layout: Layout) -> tuple[bytes, bytes, list[str]]:
    return (
        layout.state.read_bytes(),
        (layout.status / "other.json").read_bytes(),
        sorted(p.name for p in layout.store.iterdir()),
    )


@pytest.fixture
def ctx(
    host: Layout,
    kernel: str,
    signed: dict[str, Path],
    modules: dict[str, Path],
    other_key: SigningKey,
    firmware_dir: Path,
    tmp_path: Path,
) -> Ctx:
    """Another bundle taken in first, then a good drop of bundle ``test`` to spoil."""
    stage_drop(host, kernel, [signed["ms_params"]], bundle="other")
    [taken] = make_intake(host).run()
    assert taken.accepted, taken.reasons
    drop = stage_drop(host, kernel, [signed["ms_exporter"]], firmware=(firmware_dir,))
    outside = tmp_path / "outside"
    outside.mkdir()
    shutil.copyfile(signed["ms_exporter"], outside / "canary.ko")
    (outside / "secret.txt").write_text("the host's secret\n")
    untrusted = sign(modules["ms_exporter"], other_key, tmp_path / "untrusted.ko")
    return Ctx(drop, outside, host, signed, kernel, untrusted, modules["ms_exporter"])


def test_catalogue_is_large_and_distinct() -> None:
    """The catalogue holds at least 50 distinct cases."""
    ids = [c.id for c in CASES]
    assert len(ids) >= 50 and len(set(ids)) == len(ids), ids


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_hostile_drop_is_rejected_with_its_reason(ctx: Ctx, case: Case) -> None:
    """Rejected with exactly the expected reason; nothing outside read; nothing else changed."""
    expected = case.plant(ctx)
    before = _snapshot(ctx.layout)
    watch, nodes = _watch(ctx.outside), _watch_nodes(ctx.layout.incoming)
    try:
        outcomes = _run_intake(ctx.layout, case.config)
        seen, opened = watch.events(), nodes.events()
    finally:
        watch.close()
        nodes.close()
    [outcome] = outcomes
    if any(kind in case.id for kind in ("fifo", "socket", "chardev", "blockdev")):
        assert nodes.paths, "the case planted a node and the node is watched"
    assert not outcome.accepted and not outcome.deferred
    assert len(outcome.reasons) == len(expected), outcome.reasons
    # the reasons name the drop where an admin finds it: under the quarantine
    kept = str(ctx.layout.quarantine / ctx.drop.name)
    for got, want in zip(outcome.reasons, expected, strict=True):
        if isinstance(want, re.Pattern):
            moved = want.pattern.replace(re.escape(str(ctx.drop)), re.escape(kept))
            assert re.compile(moved, want.flags).fullmatch(got), got
        else:
            assert got == want.replace(str(ctx.drop), kept)
    assert seen == [], f"opened or read outside the drop: {seen}"
    assert opened == [], f"a planted FIFO, device node or socket was opened: {opened}"
    assert _snapshot(ctx.layout) == before
    assert not os.path.lexists(ctx.drop), "a rejected drop is removed from incoming/"
    assert (ctx.layout.quarantine / f"{ctx.drop.name}.json").is_file(), "and quarantined"
    status_file = ctx.layout.status / f"{outcome.bundle}.json"
    allowed = case.config.allowed_bundles if case.config else ()
    if allowed and outcome.bundle not in allowed:
        assert not status_file.exists(), "a disallowed name leaves no per-name status"
    else:
        assert '"phase": "rejected"' in status_file.read_text()


@pytest.mark.parametrize(
    "name",
    [
        b"test.\n00000000000000000001.ab",
        b"test.\xff\xfe.00000000000000000001.ab",
        b"Test.00000000000000000001.ab",
        b"../test.00000000000000000001.ab"[3:] + b".x",
    ],
    ids=["newline", "non-utf8", "uppercase-bundle", "bad-key"],
)
def test_entries_that_are_not_drops_are_left_alone(ctx: Ctx, name: bytes) -> None:
    """An incoming entry whose name is not a drop name is ignored: not read, not removed."""
    odd = Path(os.fsdecode(os.fsencode(ctx.layout.incoming) + b"/" + name))
    os.rename(ctx.drop, odd)
    (odd / "modules/link.ko").symlink_to(ctx.outside / "canary.ko")
    before = _snapshot(ctx.layout)
    watch = _watch(ctx.outside)
    try:
        outcomes = _run_intake(ctx.layout, Config())
        seen = watch.events()
    finally:
        watch.close()
    assert outcomes == []
    assert seen == []
    assert os.path.isdir(odd)
    assert _snapshot(ctx.layout) == before


def test_fifo_named_like_a_drop_is_left_alone(ctx: Ctx) -> None:
    """A FIFO (or file) in incoming/ with a drop's name is no drop: the intake returns at once,
    never having opened the FIFO."""
    fifo = ctx.layout.incoming / "test.00000000000000000001.ab"
    os.mkfifo(fifo)
    (ctx.layout.incoming / "test.00000000000000000002.ab").write_text("x")
    shutil.rmtree(ctx.drop)
    nodes = _watch_nodes(ctx.layout.incoming)
    try:
        assert _run_intake(ctx.layout, Config(), timeout=10) == []
        opened = nodes.events()
    finally:
        nodes.close()
    assert list(nodes.paths.values()) == [fifo] and opened == []


def test_unlisted_hostile_files_are_never_opened(ctx: Ctx) -> None:
    """Links, FIFOs, devices, odd names and a deep tree the manifest does not name: never read.

    The drop is accepted; removing it unlinks the hard link, never the canary.
    """
    extra = ctx.drop / "extra"
    extra.mkdir()
    (extra / "to-canary").symlink_to(ctx.outside / "canary.ko")
    (extra / "to-shadow").symlink_to(SHADOW)
    os.link(ctx.outside / "secret.txt", extra / "hard-secret")
    os.mkfifo(extra / "fifo")
    os.mknod(extra / "zero", stat.S_IFCHR | 0o600, os.makedev(1, 5))
    os.mknod(extra / "sock", stat.S_IFSOCK | 0o600)
    (extra / "new\nline").write_text("x")
    Path(os.fsdecode(os.fsencode(extra) + b"/bad-\xff-name")).write_text("x")
    deep = extra
    for _ in range(200):
        deep = deep / "d"
    deep.mkdir(parents=True)
    (deep / "leaf").symlink_to(ctx.outside)
    os.mkfifo(deep / "fifo")
    watch, nodes = _watch(ctx.outside), _watch_nodes(ctx.layout.incoming)
    assert len(nodes.paths) == 4  # the FIFOs, the device node, the socket
    try:
        [outcome] = _run_intake(ctx.layout, Config())
        seen, opened = watch.events(), nodes.events()
    finally:
        watch.close()
        nodes.close()
    assert outcome.accepted, outcome.reasons
    assert seen == []
    assert opened == [], f"a planted FIFO, device node or socket was opened: {opened}"
    assert not os.path.lexists(ctx.drop)
    assert (ctx.outside / "secret.txt").stat().st_nlink == 1
    assert (ctx.outside / "canary.ko").is_file() and SHADOW.is_file()


def test_canary_watch_sees_a_read(ctx: Ctx) -> None:
    """The watch is not blind: reading the canary through a symlink is reported."""
    watch = _watch(ctx.outside)
    try:
        (ctx.drop / "peek").symlink_to(ctx.outside / "canary.ko")
        (ctx.drop / "peek").read_bytes()
        seen = watch.events()
    finally:
        watch.close()
    assert (str(ctx.outside / "canary.ko"), "open") in seen
    assert (str(ctx.outside / "canary.ko"), "access") in seen


def test_node_watch_sees_an_open_of_a_fifo_and_a_device(ctx: Ctx) -> None:
    """The node watch is not blind: a non-blocking open of a planted FIFO or device node
    (what ``O_RDONLY | O_NONBLOCK`` instead of ``O_PATH`` would do) is reported, while an
    ``O_PATH`` open, the product's way to look before opening, is not."""
    os.mkfifo(ctx.drop / "fifo")
    os.mknod(ctx.drop / "zero", stat.S_IFCHR | 0o600, os.makedev(1, 5))
    nodes = _watch_nodes(ctx.layout.incoming)
    try:
        for name in ("fifo", "zero"):
            os.close(os.open(ctx.drop / name, os.O_PATH | os.O_NOFOLLOW))
        quiet = nodes.events()
        for name in ("fifo", "zero"):
            os.close(os.open(ctx.drop / name, os.O_RDONLY | os.O_NONBLOCK))
        seen = nodes.events()
    finally:
        nodes.close()
    assert quiet == []
    assert sorted(seen) == [(f"{ctx.d}/fifo", "open"), (f"{ctx.d}/zero", "open")], seen


def test_canary_watch_sees_an_open_through_a_hard_link(ctx: Ctx) -> None:
    """Opening the canary's inode through a hard link inside the drop is reported too."""
    os.link(ctx.outside / "secret.txt", ctx.drop / "hard")
    watch = _watch(ctx.outside)
    try:
        os.close(os.open(ctx.drop / "hard", os.O_RDONLY))
        seen = watch.events()
    finally:
        watch.close()
    assert any(
        kind == "open" and path.startswith(str(ctx.outside / "secret.txt")) for path, kind in seen
    ), seen


def test_daemon_loop_stays_responsive_with_fifo_drops(ctx: Ctx) -> None:
    """The daemon's loop takes FIFO drops (a FIFO module, a FIFO manifest) without blocking
    and without opening either FIFO (inotify on both).

    A good drop staged afterwards is still taken in, and the loop stops when asked.
    """
    from service.daemon.events import Event, Kind
    from service.daemon.loop import Daemon
    from service.daemon.watcher import DropWatcher
    from service.reboot import NoRebooter
    from service.store.phase import Phase

    good = ctx.drop.with_name("keep")
    shutil.copytree(ctx.drop, good)
    ctx.replace_with(M, os.mkfifo)
    second = stage_drop(ctx.layout, ctx.kernel, [ctx.signed["ms_params"]], bundle="fifo")
    _moved_out(
        Ctx(second, ctx.outside, ctx.layout, ctx.signed, ctx.kernel, ctx.untrusted, ctx.unsigned),
        MANIFEST_NAME,
    )
    os.mkfifo(second / MANIFEST_NAME)
    nodes = _watch_nodes(ctx.layout.incoming)
    assert len(nodes.paths) == 2
    daemon = Daemon(ctx.layout, Config(), make_intake(ctx.layout), NoRebooter(), debounce=0.05)
    watcher = DropWatcher([ctx.layout.incoming], daemon.events)
    watcher.start()
    thread = threading.Thread(target=daemon.loop, daemon=True)
    thread.start()
    try:
        deadline = time.monotonic() + 20
        status = ctx.layout.status
        while not all(
            (status / f"{b}.json").is_file() and '"rejected"' in (status / f"{b}.json").read_text()
            for b in ("test", "fifo")
        ):
            assert time.monotonic() < deadline and thread.is_alive(), "FIFO drops blocked the loop"
            time.sleep(0.02)
        shutil.move(good, ctx.layout.incoming / ctx.drop.name.replace("0", "1", 1))
        daemon.events.put(Event(Kind.DROP, "test"))
        while load(ctx.layout.state).bundle("test").phase is not Phase.PENDING:
            assert time.monotonic() < deadline and thread.is_alive(), "loop unresponsive"
            time.sleep(0.02)
        opened = nodes.events()
    finally:
        daemon.events.put(Event(Kind.STOP))
        thread.join(10)
        watcher.stop()
        nodes.close()
    assert not thread.is_alive()
    assert opened == [], f"a planted FIFO was opened: {opened}"

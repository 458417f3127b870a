"""Hostile drops whose bytes, names or claims are wrong: undeclared firmware, paths that
escape or are malformed, manifests that are not TOML or not schema 1, files swapped after the
manifest was written, untrusted or unsigned modules, another kernel, and what the host's
policy or the bundle's state refuses (:data:`CONTENT_CASES`)."""

from __future__ import annotations

import hashlib
import re
import shutil
import tomllib
from collections.abc import Callable
from dataclasses import replace

from service.bundles.phase import Phase
from service.bundles.state import Generation
from service.bundles.statefile import load, save
from service.config import BundlePolicy, Config
from service.layout import modules_dir
from stager.schema.manifest import MemoryPolicy
from stager.schema.paths import MANIFEST_NAME
from tests.hardening.hostile_case import Case, Ctx, F, M, Plant, sha


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
    from stager.schema.manifest import Manifest

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
        data["module"][0]["sha256"] = sha(source)  # type: ignore[index]
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
    modules_dir(ctx.layout, "6.12.0-1-amd64").mkdir(parents=True)
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


CONTENT_CASES = [
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

"""Seeded generators of hostile drops for the running-daemon fuzzer (test_drop_fuzzer.py).

Each generator gets a ``random.Random``, the incoming directory, a template drop
(a good, signed drop of bundle ``tmpl`` it may copy) and a canary directory outside
the host root; it plants one hostile entry in ``incoming/`` and returns its kind.
Classes: structure, sizes, names, TOML shapes, filesystem object types, and races
(a thread swapping files or renaming the drop while the daemon reads it).
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import shutil
import stat
import threading
import time
import tomllib
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import tomli_w

from service.dropfs import remove_tree
from service.layout import Layout
from service.publish import quarantine
from stager.schema.paths import MANIFEST_NAME, drop_name, parse_drop_name
from tests.hardening.conftest import chain
from tests.hardening.watch import AccessWatch

M = "modules/ms_exporter.ko"


@dataclass
class World:
    """What a generator may use: where to drop, a template to copy, what lies outside.

    ``nodes`` watches every FIFO, device node and socket a generator plants; each is
    added before the node is renamed into ``incoming/``, so no open of it goes unseen.
    """

    incoming: Path
    template: Path  # a good drop (not in incoming) of bundle "tmpl"
    outside: Path  # canaries outside the host root
    races: list[threading.Thread]
    nodes: AccessWatch | None = None

    def planted(self, node: Path) -> None:
        """A node was made (not yet visible to the daemon): watch it for opens."""
        if self.nodes is not None:
            self.nodes.add(node)


Gen = Callable[[random.Random, World], str]


def _name(rng: random.Random, bundle: str | None = None) -> str:
    bundle = bundle or rng.choice(["evil", "nvidia", "x", "a" * 60, "z9", "tmpl", "junk"])
    return drop_name(bundle, time.time_ns() + rng.randrange(10**6), f"{rng.getrandbits(64):016x}")


def _copy_template(rng: random.Random, w: World, bundle: str = "tmpl") -> Path:
    """A copy of the good template drop, without its manifest yet (it is returned renamed)."""
    tmp = w.incoming / f".tmp-{rng.getrandbits(64):016x}"
    shutil.copytree(w.template, tmp, symlinks=True)
    (tmp / MANIFEST_NAME).unlink()
    return tmp


def _finish(w: World, tmp: Path, manifest: bytes | None, name: str) -> Path:
    """Write ``manifest`` (if any) and rename the drop to its name: it is complete."""
    if manifest is not None:
        (tmp / MANIFEST_NAME).write_bytes(manifest)
    final = w.incoming / name
    os.rename(tmp, final)
    return final


def _manifest(w: World) -> dict[str, object]:
    return tomllib.loads((w.template / MANIFEST_NAME).read_text())


# structure -----------------------------------------------------------------------------


def manifest_dir_chain(rng: random.Random, w: World) -> str:
    tmp = _copy_template(rng, w)
    (tmp / MANIFEST_NAME).mkdir()
    chain(tmp / MANIFEST_NAME, rng.choice([10, 200, 1500]), extra=False)
    _finish(w, tmp, None, _name(rng))
    return "manifest-dir-chain"


def unlisted_deep_tree(rng: random.Random, w: World) -> str:
    tmp = _copy_template(rng, w)
    (tmp / "junk").mkdir()
    chain(tmp / "junk", rng.choice([50, 500, 1200]), extra=False)
    data = (w.template / MANIFEST_NAME).read_bytes()
    _finish(w, tmp, data, _name(rng, rng.choice(["tmpl", "evil"])))
    return "unlisted-deep-tree"


def many_entries(rng: random.Random, w: World) -> str:
    tmp = _copy_template(rng, w)
    for i in range(rng.choice([100, 1000, 3000])):
        (tmp / f"e{i}").touch()
    _finish(w, tmp, b"schema = 1\n", _name(rng))
    return "many-entries"


def drop_not_a_directory(rng: random.Random, w: World) -> str:
    path = w.incoming / f".tmp-{rng.getrandbits(64):016x}"
    kind = rng.choice(["file", "fifo", "symlink-out", "symlink-dangling", "socket"])
    if kind == "file":
        path.write_bytes(b"schema = 1\n")
    elif kind == "fifo":
        os.mkfifo(path)
        w.planted(path)
    elif kind == "symlink-out":
        path.symlink_to(w.outside)
    elif kind == "symlink-dangling":
        path.symlink_to(w.outside / "nothing")
    else:
        os.mknod(path, 0o600 | stat.S_IFSOCK)
        w.planted(path)
    os.rename(path, w.incoming / _name(rng))
    return f"drop-{kind}"


def missing_files(rng: random.Random, w: World) -> str:
    tmp = _copy_template(rng, w)
    shutil.rmtree(tmp / "modules")
    _finish(w, tmp, (w.template / MANIFEST_NAME).read_bytes(), _name(rng))
    return "missing-files"


# sizes ---------------------------------------------------------------------------------


def huge_manifest(rng: random.Random, w: World) -> str:
    base = (w.template / MANIFEST_NAME).read_bytes()
    size = rng.choice([(1 << 20) - 200, (1 << 20) + 1, 5 << 20])
    junk = b"".join(b"k%07d = 1\n" % i for i in range(max(0, size - len(base)) // 12))
    tmp = _copy_template(rng, w)
    _finish(w, tmp, base + junk, _name(rng))
    return "huge-manifest"


def long_lists(rng: random.Random, w: World) -> str:
    data = _manifest(w)
    key = rng.choice(["after", "module", "firmware"])
    n = rng.choice([257, 5000, 60_000])
    if key == "after":
        data["after"] = [f"b{i}" for i in range(n)]
    else:
        data[key] = [{"file": f"modules/m{i}.ko", "sha256": "0" * 64} for i in range(n)]
    raw = tomli_w.dumps(data).encode()[: 1 << 20]
    tmp = _copy_template(rng, w)
    _finish(w, tmp, raw, _name(rng))
    return f"long-{key}"


def sparse_module(rng: random.Random, w: World) -> str:
    tmp = _copy_template(rng, w)
    os.truncate(tmp / M, rng.choice([1 << 30, 3 << 30, 1 << 40]))
    _finish(w, tmp, (w.template / MANIFEST_NAME).read_bytes(), _name(rng))
    return "sparse-module"


# names and text ------------------------------------------------------------------------

_NASTY = [
    "\x1b[2J\x1b[H",
    "\nhost: ok\n",
    "[/]",
    "[bold red]x[/]",
    "\r\x07",
    "\u202e",
    "😀",
    "\x00",
]


def nasty_text(rng: random.Random, w: World) -> str:
    data = _manifest(w)
    text = "".join(rng.choice(_NASTY) for _ in range(rng.randint(1, 6))).replace("\x00", "")
    where = rng.choice(["key", "version", "params", "file", "after"])
    if where == "key":
        data[text] = text
    elif where == "version":
        data["version"] = text
    elif where == "params":
        data["module"][0]["params"] = text  # type: ignore[index]
    elif where == "file":
        data["module"][0]["file"] = f"modules/{text}.ko"  # type: ignore[index]
    else:
        data["after"] = [text]
    tmp = _copy_template(rng, w)
    _finish(w, tmp, tomli_w.dumps(data).encode(), _name(rng))
    return f"nasty-{where}"


def odd_drop_names(rng: random.Random, w: World) -> str:
    bad = rng.choice(
        ["..", ".hidden.1.2", "tmpl.1", "tmpl.x.y.z", "\x1b[2J.1.aa", "a/b", "tmpl.1.AB", "-.1.2"]
    )
    tmp = _copy_template(rng, w)
    (tmp / MANIFEST_NAME).write_bytes((w.template / MANIFEST_NAME).read_bytes())
    name = bad.replace("/", "_")
    try:
        os.rename(tmp, w.incoming / name)
    except OSError:
        shutil.rmtree(tmp)
        return "odd-name-refused"
    # not a drop name: the daemon must leave it alone; the fuzzer removes it afterwards
    return "odd-name:" + name


def disallowed_bundle(rng: random.Random, w: World) -> str:
    data = _manifest(w)
    bundle = f"dis{rng.getrandbits(32):08x}"
    data["bundle"] = bundle
    tmp = _copy_template(rng, w)
    _finish(w, tmp, tomli_w.dumps(data).encode(), _name(rng, bundle))
    return "disallowed-bundle"


# TOML shapes ---------------------------------------------------------------------------


def random_toml(rng: random.Random, w: World) -> str:
    shapes = [
        b"schema = 1\na = " + b"[" * 5000 + b"]" * 5000 + b"\n",
        b"schema = 1\na = " + b"{b=" * 3000 + b"1" + b"}" * 3000 + b"\n",
        bytes(rng.getrandbits(8) for _ in range(rng.randint(0, 400))),
        b'schema = "1"\nbundle = 7\nmodule = "x"\n',
        b"schema = 99\n",
        b"\xff\xfe\x00s",
        json.dumps({"schema": 1}).encode(),
    ]
    data = _manifest(w)
    data[rng.choice(["module", "firmware", "memory", "after"])] = rng.choice(
        [1, "s", [1, 2], {"a": {"b": []}}, [{"file": 3}], True]
    )
    shapes.append(tomli_w.dumps(data).encode())
    tmp = _copy_template(rng, w)
    _finish(w, tmp, rng.choice(shapes), _name(rng))
    return "toml-shape"


# filesystem object types ---------------------------------------------------------------


def odd_objects(rng: random.Random, w: World) -> str:
    tmp = _copy_template(rng, w)
    target = tmp / (M if rng.random() < 0.7 else MANIFEST_NAME)
    if target.exists():
        target.unlink()
    kind = rng.choice(["fifo", "symlink-canary", "hardlink-canary", "dir", "socket", "dev-null"])
    if kind == "fifo":
        os.mkfifo(target)
        w.planted(target)
    elif kind == "symlink-canary":
        target.symlink_to(w.outside / "canary")
    elif kind == "hardlink-canary":
        try:
            os.link(w.outside / "canary", target)
        except OSError:  # another file system: a symlink instead
            target.symlink_to(w.outside / "canary")
    elif kind == "dir":
        target.mkdir()
    elif kind == "socket":
        os.mknod(target, 0o600 | stat.S_IFSOCK)
        w.planted(target)
    else:
        os.mknod(target, 0o600 | stat.S_IFCHR, os.makedev(1, 3))
        w.planted(target)
    # a version of its own (a generation already staged is not read again) and a drop
    # named for its manifest's bundle: intake gets as far as opening the object
    data = {**_manifest(w), "version": f"obj.{rng.getrandbits(32):08x}"}
    manifest = None if target.name == MANIFEST_NAME else tomli_w.dumps(data).encode()
    if manifest is None and not os.path.lexists(target):
        manifest = b""
    _finish(w, tmp, manifest, _name(rng, "tmpl"))
    return f"object-{kind}"


# races ---------------------------------------------------------------------------------


def racing(rng: random.Random, w: World) -> str:
    """A good-looking drop whose files are swapped, or which is renamed, while it is read."""
    tmp = _copy_template(rng, w)
    final = _finish(w, tmp, (w.template / MANIFEST_NAME).read_bytes(), _name(rng))
    kind = rng.choice(["swap-module", "swap-symlink", "rename-away", "swap-dir"])
    seed = rng.getrandbits(32)

    def race() -> None:
        r = random.Random(seed)
        end = time.monotonic() + 0.4
        while time.monotonic() < end:
            try:
                if kind == "swap-module":
                    (final / "swap").write_bytes(os.urandom(r.randint(1, 4096)))
                    os.replace(final / "swap", final / M)
                elif kind == "swap-symlink":
                    (final / "swap").symlink_to(w.outside / "canary")
                    os.replace(final / "swap", final / M)
                elif kind == "rename-away":
                    away = final.with_name(final.name + "x")
                    os.rename(final, away)
                    os.rename(away, final)
                else:
                    os.rename(final / "modules", final / "m2")
                    (final / "modules").symlink_to(w.outside)
                    os.unlink(final / "modules")
                    os.rename(final / "m2", final / "modules")
            except OSError:
                return  # taken in or removed meanwhile
            time.sleep(r.random() * 0.01)

    thread = threading.Thread(target=race, daemon=True)
    thread.start()
    w.races.append(thread)
    return f"race-{kind}"


GENERATORS: list[Gen] = [
    manifest_dir_chain,
    unlisted_deep_tree,
    many_entries,
    drop_not_a_directory,
    missing_files,
    huge_manifest,
    long_lists,
    sparse_module,
    nasty_text,
    odd_drop_names,
    disallowed_bundle,
    random_toml,
    odd_objects,
    racing,
]


# after a round ---------------------------------------------------------------------------


def pending(host: Layout, bundle: str, generation: str) -> bool:
    """Whether ``bundle``'s status file names ``generation`` as pending."""
    try:
        doc = json.loads((host.status / f"{bundle}.json").read_bytes())
    except (OSError, ValueError):
        return False
    return bool(doc.get("pending") == generation)


def drops_left(host: Layout) -> list[str]:
    """Complete drops the daemon has still to handle (incomplete ones it rightly leaves)."""
    return [
        n
        for n in os.listdir(host.incoming)
        if parse_drop_name(n)
        and os.path.lexists(host.incoming / n / MANIFEST_NAME)
        and not quarantine.left_in_place(host, host.incoming / n)
    ]


def clear_non_drops(host: Layout, seen_before: set[str]) -> set[str]:
    """Remove what the daemon rightly leaves alone (odd names, incomplete drops).

    Only entries already left alone at the previous check are removed: one that just
    became incomplete may be a drop the daemon is removing right now.
    """
    left = {
        n
        for n in os.listdir(host.incoming)
        if parse_drop_name(n) is None or not os.path.lexists(host.incoming / n / MANIFEST_NAME)
    }
    for name in left & seen_before:
        with contextlib.suppress(OSError):
            remove_tree(host.incoming, name, max_entries=1 << 20)
    return left - seen_before

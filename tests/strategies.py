"""Hypothesis strategies shared by the test suite."""

from __future__ import annotations

from dataclasses import fields

from hypothesis import strategies as st

from service.config import REBOOT_KEYS, Config, Limits
from stager.schema.manifest import FirmwareEntry, Manifest, MemoryPolicy, ModuleEntry

_LOWER = "abcdefghijklmnopqrstuvwxyz0123456789"
_ALNUM = _LOWER + "ABCDEFGHIJKLMNOPQRSTUVWXYZ"


def _word(first: str, rest: str, max_size: int) -> st.SearchStrategy[str]:
    return st.builds(str.__add__, st.sampled_from(first), st.text(rest, max_size=max_size))


bundle_names = _word(_LOWER, _LOWER + "_-", 20)
tokens = _word(_ALNUM, _ALNUM + "._+~:-", 30)
#: version strings as dpkg reads them (epoch, '-' revisions, '~' and '+'), kernel releases too
debian_versions = st.builds(
    str.__add__,
    st.sampled_from(["", "1:", "2:"]),
    _word("0123456789", "0123456789.+~-ab", 16).filter(lambda v: not v.endswith("-")),
)
digests = st.text(alphabet="0123456789abcdef", min_size=64, max_size=64)
_component = _word(_ALNUM + "_", _ALNUM + "_+=@,-", 11)
rel_dirs = st.lists(_component, max_size=3).map(lambda parts: "".join(p + "/" for p in parts))
param_names = _word(_ALNUM[:26] + _ALNUM[36:] + "_", _ALNUM + "_", 10)
param_values = st.one_of(
    st.none(),
    st.text(_ALNUM + "_,.:/=-", min_size=1, max_size=12),
    st.builds(
        lambda a, b: f"{a} {b}",
        st.text(_ALNUM, min_size=1, max_size=5),
        st.text(_ALNUM + " ", max_size=6),
    ),
)


@st.composite
def params(draw: st.DrawFn) -> str:
    """A valid kernel parameter string in canonical spelling."""
    words = []
    for name, value in draw(st.lists(st.tuples(param_names, param_values), max_size=4)):
        if value is None:
            words.append(name)
        elif " " in value:
            words.append(f'{name}="{value}"')
        else:
            words.append(f"{name}={value}")
    return " ".join(words)


@st.composite
def manifests(draw: st.DrawFn) -> Manifest:
    """Any valid schema-1 manifest."""
    bundle = draw(bundle_names)
    names = draw(st.lists(param_names, min_size=1, max_size=5, unique_by=str.lower))
    modules = tuple(
        ModuleEntry(
            file=draw(rel_dirs) + name + draw(st.sampled_from([".ko", ".ko.xz", ".ko.zst"])),
            sha256=draw(digests),
            params=draw(params()),
        )
        for name in names
    )
    fw_names = draw(st.lists(_component, max_size=4, unique=True))
    firmware = tuple(
        FirmwareEntry(file="firmware/" + draw(rel_dirs) + f"{n}.bin", sha256=draw(digests))
        for n in fw_names
    )
    firmware = tuple({f.file: f for f in firmware}.values())
    after = draw(st.lists(bundle_names.filter(lambda b: b != bundle), unique=True, max_size=3))
    return Manifest(
        bundle=bundle,
        version=draw(tokens),
        kernel=draw(tokens),
        modules=modules,
        firmware=firmware,
        after=tuple(after),
        memory=draw(st.none() | st.sampled_from(list(MemoryPolicy))),
    )


# TOML shapes for the parsers of what others wrote (manifest, config) ----------------

_keys = st.sampled_from(
    [
        "schema",
        "bundle",
        "version",
        "kernel",
        "after",
        "module",
        "firmware",
        "memory",
        "file",
        "sha256",
        "params",
        "auto_online_blocks",
        # config.toml's top level, its [limits] and [reboot] tables, as the config names them
        *(f.name for f in fields(Config)),
        *(f.name for f in fields(Limits)),
        *sorted(REBOOT_KEYS),
        "x",
    ]
) | st.text(max_size=8)
_scalars = (
    st.integers(min_value=-(2**63), max_value=2**63 - 1)
    | st.booleans()
    | st.floats(allow_nan=False)
    | st.text(max_size=40)
    | st.sampled_from(
        ["1", "test", "modules/a.ko", "online", "command", "UTC", "22:00", "mon", "firmware/x"]
    )
)
#: Any TOML value: scalars, arrays and tables, nested.
toml_values = st.recursive(
    _scalars,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(_keys, inner, max_size=5),
    max_leaves=15,
)
#: Any TOML table, keys mostly the schemas' own.
toml_tables = st.dictionaries(_keys, toml_values, max_size=8)


_OPTIONAL_CHANGES = ["none", "none", "none", "omit-optional", "omit-optional"]
_BREAKING_CHANGES = ["drop-key", "unknown-key", "retype", "arbitrary"]


def manifest_table(m: Manifest) -> dict[str, object]:
    """``m`` as a manifest.toml table, written out here (not by ``Manifest.to_dict``, the
    code under test) with every key present."""
    table: dict[str, object] = {
        "schema": 1,
        "bundle": m.bundle,
        "version": m.version,
        "kernel": m.kernel,
        "after": list(m.after),
        "module": [{"file": e.file, "sha256": e.sha256, "params": e.params} for e in m.modules],
    }
    if m.firmware:
        table["firmware"] = [{"file": e.file, "sha256": e.sha256} for e in m.firmware]
    if m.memory is not None:
        table["memory"] = {"auto_online_blocks": m.memory.value}
    return table


@st.composite
def manifest_tables(draw: st.DrawFn) -> tuple[Manifest | None, dict[str, object]]:
    """TOML tables for a manifest, most of them valid: ``(the manifest it must parse to,
    or None, the table)``.

    A valid manifest's table (:func:`manifest_table`, keys in any order) as it is or with
    its optional keys left out (empty ``after``, empty ``params``: valid, not canonical),
    five times in nine; otherwise with one change that usually breaks it (None): a key
    dropped, an unknown key added, a value replaced by any TOML value, or an arbitrary
    table.
    """
    manifest = draw(manifests())
    full = manifest_table(manifest)
    table = {k: full[k] for k in draw(st.permutations(sorted(full)))}
    change = draw(st.sampled_from(_OPTIONAL_CHANGES + _BREAKING_CHANGES))
    if change == "omit-optional":
        if table["after"] == []:
            del table["after"]
        for entry in table["module"]:  # type: ignore[attr-defined]
            if entry["params"] == "":
                del entry["params"]
    elif change == "drop-key":
        del table[draw(st.sampled_from(sorted(table)))]
    elif change == "unknown-key":
        table[draw(st.text(min_size=1, max_size=8).filter(lambda k: k not in table))] = draw(
            toml_values
        )
    elif change == "retype":
        table[draw(st.sampled_from(sorted(table)))] = draw(toml_values)
    elif change == "arbitrary":
        table = draw(toml_tables)
    return (manifest if change in _OPTIONAL_CHANGES else None), table

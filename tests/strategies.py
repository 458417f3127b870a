"""Hypothesis strategies shared by the test suite."""

from __future__ import annotations

from hypothesis import strategies as st

from stager.manifest import FirmwareEntry, Manifest, MemoryPolicy, ModuleEntry

_LOWER = "abcdefghijklmnopqrstuvwxyz0123456789"
_ALNUM = _LOWER + "ABCDEFGHIJKLMNOPQRSTUVWXYZ"


def _word(first: str, rest: str, max_size: int) -> st.SearchStrategy[str]:
    return st.builds(str.__add__, st.sampled_from(first), st.text(rest, max_size=max_size))


bundle_names = _word(_LOWER, _LOWER + "_-", 20)
tokens = _word(_ALNUM, _ALNUM + "._+~:-", 30)
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

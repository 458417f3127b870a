"""Which firmware a drop may carry: the names its own modules declare, or the host allows.

The kernel's firmware loader searches ``firmware_class.path`` (modstage's view of every
loaded generation's ``firmware/``) before ``/lib/firmware/updates/<release>``,
``/lib/firmware/updates``, ``/lib/firmware/<release>`` and ``/lib/firmware``, for every
``request_firmware()`` of every driver (``fw_path[]``, drivers/base/firmware_loader/main.c).
A drop's file named like another driver's firmware would be loaded in its place. So a
drop's firmware file must be a name one of the drop's own verified modules declares
(``.modinfo`` ``firmware=``, the kernel's ``MODULE_FIRMWARE``) or one the host's
``[bundles.<name>] firmware`` allows, and a name a host firmware directory also provides
is refused unless ``[bundles.<name>] firmware_override`` allows it. A name another bundle's
active or pending generation carries is refused whatever the table says: the view holds one
file per request, so at boot the bundle linked first would take it and the other's generation
fail (:mod:`service.intake.owners` draws who carries what).

Pure: the host's files are asked through a callable.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from fnmatch import fnmatchcase

from service.config import BundlePolicy

PREFIX = "firmware/"


def requested_path(name: str) -> str | None:
    """The path below a search directory the loader opens for ``request_firmware(name)``,
    or None when it opens none: an empty name (``EINVAL``) or one with a ``..`` component
    (refused: ``name_contains_dotdot``, in Debian's 6.1 and in 6.12). The loader formats
    ``<dir>/<name>``, so empty and ``.`` components and a leading ``/`` name no other file.
    """
    parts = name.split("/")
    if not name or ".." in parts:
        return None
    kept = [p for p in parts if p not in ("", ".")]
    return "/".join(kept) or None


def answered(name: str, suffixes: Sequence[str]) -> tuple[str, ...]:
    """The requests a drop's file ``name`` (below ``firmware/``) answers: its own name, and
    the name without a compression suffix the target's loader decompresses."""
    return (name, *(name[: -len(s)] for s in suffixes if s and name.endswith(s) and name != s))


def shadowed(name: str, suffixes: Sequence[str]) -> tuple[str, ...]:
    """The names below a host firmware directory the file ``name`` is loaded in place of.

    The loader tries a request in every directory (``firmware_class.path``, the view, first)
    with each suffix in turn: the plain name everywhere, then ``.zst`` everywhere, then
    ``.xz``. As the request ``name``, the file stands before the host's same name and that
    name with every suffix; where ``name`` is ``base`` with a suffix, as the request
    ``base`` it stands before the host's ``base`` with that suffix and every later one (the
    host's ``base`` with an earlier suffix is found first, and stays the host's)."""
    out = [name + s for s in suffixes]
    for i, suffix in enumerate(suffixes):
        if suffix and name.endswith(suffix) and name != suffix:
            out += [name[: -len(suffix)] + later for later in suffixes[i + 1 :]]
    return tuple(dict.fromkeys(out))


def requests_of(
    carried: Mapping[str, tuple[str, str]], suffixes: Sequence[str]
) -> dict[str, tuple[str, str, str]]:
    """Each request the firmware entries ``carried`` (``firmware/...`` -> (bundle,
    generation)) answer -> (entry, bundle, generation)."""
    return {
        request: (entry, *owner)
        for entry, owner in sorted(carried.items())
        for request in answered(entry.removeprefix(PREFIX), suffixes)
    }


def _matches(globs: Iterable[str], names: Iterable[str]) -> bool:
    return any(fnmatchcase(n, g) for g in globs for n in names)


def firmware_problems(
    files: Sequence[str],
    declared: Iterable[str],
    *,
    bundle: str,
    policy: BundlePolicy,
    host_file: Callable[[str], str | None],
    suffixes: Sequence[str] = ("",),
    carried: Mapping[str, tuple[str, str]] | None = None,
) -> list[str]:
    """Every firmware file of a drop the host refuses, each naming the file and the rule.

    ``files``: the manifest's firmware entries (``firmware/...``); ``declared``: the
    ``firmware=`` names of the drop's verified modules; ``host_file``: the host path that
    provides a name below a firmware directory (shown as the host names it), or None;
    ``carried``: each firmware entry of the other bundles' active and pending generations
    -> (bundle, generation).
    """
    wanted = {p for p in map(requested_path, declared) if p is not None}
    theirs = requests_of(carried or {}, suffixes)
    problems = []
    for file in files:
        name = file.removeprefix(PREFIX)
        names = answered(name, suffixes)
        for request in names:
            if request in theirs:
                entry, other, generation = theirs[request]
                problems.append(
                    f"{file}: bundle {other!r} carries {entry} (generation {generation[:12]}), "
                    f"the firmware {request!r} too, so bundle {bundle!r} may not: one file "
                    "answers a request; stage it in one bundle"
                )
                break
        if not wanted.intersection(names) and not _matches(policy.firmware, names):
            problems.append(
                f"{file}: not declared by any module of the drop (MODULE_FIRMWARE) "
                f"and not in [bundles.{bundle}] firmware"
            )
        if _matches(policy.firmware_override, names):
            continue
        for candidate in shadowed(name, suffixes):
            found = host_file(candidate)
            if found is not None:
                problems.append(
                    f"{file}: the host provides {found}; [bundles.{bundle}] "
                    "firmware_override does not name it"
                )
                break
    return problems

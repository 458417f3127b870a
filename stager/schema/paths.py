"""Names and relative paths that a manifest may use.

Everything here is checked before a path touches a file system: a drop is
written by a container, and its manifest must not be able to point outside it.
"""

from __future__ import annotations

import re

BUNDLE_RE = re.compile(r"[a-z0-9][a-z0-9_-]{0,62}\Z")
MODULE_SUFFIXES = (".ko", ".ko.xz", ".ko.zst", ".ko.gz")
MAX_PATH_LEN = 1024
MAX_COMPONENT_LEN = 255
MAX_DEPTH = 16
MANIFEST_NAME = "manifest.toml"
DIGEST_NAME = "config-digest"  # the operator's DRIVER_CONFIG_DIGEST, beside the manifest


def bundle_problem(name: str) -> str | None:
    """Why ``name`` is not a safe bundle name, or None if it is."""
    if not BUNDLE_RE.match(name):
        return (
            f"{name!r} is not a safe bundle name "
            "(lowercase letters, digits, '_' and '-', starting with a letter or digit, "
            "at most 63 characters)"
        )
    return None


def relpath_problem(path: str) -> str | None:
    """Why ``path`` is not a normalized relative path inside a drop, or None."""
    if path == "":
        return "is empty"
    if len(path.encode("utf-8", "surrogatepass")) > MAX_PATH_LEN:
        return f"is longer than {MAX_PATH_LEN} bytes"
    if any(not ch.isprintable() or ch in "\\" for ch in path):
        return f"{path!r} contains a control character or backslash"
    if path.startswith("/"):
        return f"{path!r} is absolute"
    parts = path.split("/")
    if ".." in parts:
        return f"{path!r} contains '..'"
    if any(part in ("", ".") for part in parts):
        return f"{path!r} is not normalized (empty or '.' component)"
    if len(parts) > MAX_DEPTH:
        return f"{path!r} is deeper than {MAX_DEPTH} components"
    if any(len(part.encode()) > MAX_COMPONENT_LEN for part in parts):
        return f"{path!r} has a component longer than {MAX_COMPONENT_LEN} bytes"
    if any(part.startswith(".") for part in parts):
        return f"{path!r} has a hidden component (names starting with '.' are reserved)"
    if path == MANIFEST_NAME:
        return f"{path!r} is the manifest itself"
    return None


def strip_module_suffix(name: str) -> str:
    """``name`` without its module suffix (``.ko``, ``.ko.xz``, ``.ko.zst``, ``.ko.gz``)."""
    for suffix in MODULE_SUFFIXES:
        if name.endswith(suffix):
            return name[: -len(suffix)]
    return name


def module_name(file: str) -> str:
    """The kernel's name for the module in ``file``: basename, suffix removed, '-' as '_'."""
    return normalize_module_name(strip_module_suffix(file.rsplit("/", 1)[-1]))


def normalize_module_name(name: str) -> str:
    """The one spelling of a module name modstage compares: the kernel treats '-' as '_'."""
    return name.replace("-", "_")


def drop_name(bundle: str, time_ns: int, token: str) -> str:
    """The directory name of a drop: bundle, then a key that sorts newest last."""
    return f"{bundle}.{time_ns:020d}.{token}"


def parse_drop_name(name: str) -> tuple[str, str] | None:
    """``(bundle, sort key)`` of a drop directory name, or None if it is not one."""
    bundle, dot, key = name.partition(".")
    if not dot or bundle_problem(bundle) or not re.fullmatch(r"[0-9]{20}\.[0-9a-f]{1,32}", key):
        return None
    return bundle, key

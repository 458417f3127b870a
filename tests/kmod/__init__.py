"""The shared test-module toolkit: real modules built with kbuild, signed with sign-file.

Used by the service tests and by the VM test bed (``tests/vm``)::

    from tests.kmod import build_modules, make_key, sign

    ko = build_modules()["ms_params"]                  # unsigned, cached on disk
    key = make_key(tmp_path, "p384")
    signed = sign(ko, key, tmp_path / "ms_params.ko", hash="sha384", skid=True)

Sources live in ``src/`` (C + Kbuild); the module names and their behaviour are a
contract with the VM tests.
"""

from __future__ import annotations

from tests.kmod.build import (
    MODULE_NAMES,
    build_modules,
    cache_root,
    kernel_release,
    padded_module,
)
from tests.kmod.forge import (
    MARKER,
    Signed,
    append_signature,
    compress,
    flip_bit,
    graft,
    rsa_oid_as_sha256_with_rsa,
    split,
)
from tests.kmod.keys import SigningKey, cms_sign, debian_build_cert, make_key, sign
from tests.kmod.target import install_target

__all__ = [
    "MARKER",
    "MODULE_NAMES",
    "Signed",
    "SigningKey",
    "append_signature",
    "build_modules",
    "cache_root",
    "cms_sign",
    "compress",
    "debian_build_cert",
    "flip_bit",
    "graft",
    "install_target",
    "kernel_release",
    "make_key",
    "padded_module",
    "rsa_oid_as_sha256_with_rsa",
    "sign",
    "split",
]

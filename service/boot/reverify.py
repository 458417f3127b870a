"""A stored module verified again at boot, from the descriptor the kernel is handed.

The boot opens each module once: a plain ELF is verified from that descriptor, a
compressed one (told by content, never by suffix) is decompressed once in memory and its
image verified, and the stored file's digest must still be the one intake recorded.
:class:`Reverified` carries what the loader hands the kernel next.
"""

from __future__ import annotations

import io
from dataclasses import dataclass
from typing import TYPE_CHECKING, BinaryIO

from service.errors import BootError, ModuleRejected
from stager.schema.manifest import ModuleEntry
from stager.schema.paths import normalize_module_name

if TYPE_CHECKING:  # the verify stack is imported when the first module is verified
    from service.verify.signature.trust import TrustStore
    from service.verify.targetkernel.kernel import Target
    from service.verify.verdict import Verdict


@dataclass(frozen=True)
class Reverified:
    """A module that passed: its verdict, its name as the kernel spells it, what was
    verified (the file, or its decompressed image in memory), and for a compressed module
    that image and its format."""

    verdict: Verdict
    name: str
    elf: BinaryIO
    image: bytes | None = None
    kind: str | None = None


def reverify(f: BinaryIO, module: ModuleEntry, trust: TrustStore, target: Target) -> Reverified:
    """Verify the module open at ``f`` as ``target`` will judge it; :class:`BootError` if
    it fails or its stored file is no longer the one intake published."""
    from service.verify.verdict import verify_module

    stored, image, kind = _image(f, module.file)
    elf: BinaryIO = f if image is None else io.BytesIO(image)
    v = verify_module(elf, display=module.file, trust=trust, kernel=target)
    if not v.ok or (stored or v.sha256) != module.sha256:
        raise BootError(f"{module.file}: {v.reason or 'digest changed in the store'}")
    return Reverified(v, normalize_module_name(v.name or module.name), elf, image, kind)


def _image(f: BinaryIO, display: str) -> tuple[str | None, bytes | None, str | None]:
    """(stored file's sha256, decompressed image, format) of a compressed module;
    (None, None, None) if plain."""
    from service.verify.compressed.decompress import Hashed, compression, decompress_file

    kind = compression(f.read(6))
    f.seek(0)
    if kind is None:
        return None, None, None
    stored = Hashed()
    try:
        image = decompress_file(f, kind, hashed=stored)
    except ModuleRejected as exc:
        raise BootError(f"{display}: {exc.reason}") from exc
    return stored.sha256.hexdigest(), image, kind

"""The appended module signature's trailer (kernel/module/signing.c, kernel/module_signature.c).

A signed module is ``[signed bytes][PKCS#7 DER][struct module_signature][MARKER]``.
:func:`parse_trailer` mirrors ``module_sig_check`` + ``mod_check_sig`` and raises
:class:`~service.errors.ModuleRejected` with the errno the kernel would return. The
PKCS#7 blob itself is parsed by :mod:`service.verify.signature.pkcs7` and judged by
:mod:`service.verify.signature.signers`.
"""

from __future__ import annotations

import struct
from typing import NamedTuple

from service.errors import ModuleRejected

MARKER = b"~Module signature appended~\n"
INFO = struct.Struct(">BBBBB3sI")  # algo, hash, id_type, signer_len, key_id_len, pad, sig_len
PKEY_ID_PKCS7 = 2
TAIL = len(MARKER) + INFO.size


class Trailer(NamedTuple):
    """Where the signature sits: bytes ``[0, signed_len)`` are signed, the blob follows."""

    signed_len: int
    sig_len: int


def parse_trailer(tail: bytes, file_len: int) -> Trailer:
    """Check the last ``min(file_len, 40)`` bytes of a module the way the kernel does."""
    if len(tail) < min(file_len, TAIL):
        raise ModuleRejected("EIO", "short read of the signature trailer")
    if file_len <= len(MARKER) or not tail.endswith(MARKER):
        raise ModuleRejected("ENODATA", "module is unsigned (no signature marker)")
    modlen = file_len - len(MARKER)
    if modlen <= INFO.size:
        raise ModuleRejected("EBADMSG", "file too short for struct module_signature")
    algo, hash_, id_type, signer_len, key_id_len, pad, sig_len = INFO.unpack(tail[-TAIL:-28])
    if sig_len >= modlen - INFO.size:
        raise ModuleRejected("EBADMSG", f"sig_len {sig_len} does not fit in the file")
    if id_type != PKEY_ID_PKCS7:
        raise ModuleRejected("ENOPKG", f"signature id_type {id_type} is not PKCS#7 (2)")
    if algo or hash_ or signer_len or key_id_len or pad != b"\0\0\0":
        raise ModuleRejected("EBADMSG", "module_signature has non-zero algo/hash/len/pad fields")
    return Trailer(signed_len=modlen - INFO.size - sig_len, sig_len=sig_len)

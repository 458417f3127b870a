"""Does the running kernel enforce module signatures, and does it trust a given key?

The kernel checks module signatures against ``.secondary_trusted_keys`` (which
links the builtin keys and, where configured, the machine/MOK keys); Debian's,
Ubuntu's and Fedora's kernels then fall back to ``.platform`` (UEFI db, MOK) on
``ENOKEY`` when built with ``CONFIG_INTEGRITY_PLATFORM_KEYRING``, and refuse a
module whose sha256 is in ``.blacklist`` (``bin:<hex>``). When the running kernel
enforces signatures, intake asks it the same questions through
``keyctl(KEYCTL_SEARCH)``: a generation the kernel is bound to refuse must never
cost a reboot.
"""

from __future__ import annotations

import ctypes
import errno
import functools
import os
import re
from pathlib import Path
from typing import NamedTuple, Protocol

from service.errors import ModuleRejected
from service.layout import Layout
from service.verify.compressed.decompress import chunks, compression
from service.verify.signature.asn1 import Asn1Error
from service.verify.signature.keyid import (
    SignerId,
    SignerName,
    distinguished_name,
)
from service.verify.signature.pkcs7 import parse_message
from service.verify.signature.trailer import TAIL, parse_trailer
from service.verify.signature.x509 import issuer_name
from service.verify.targetkernel.rules import DIGESTS, KernelRules

_SYS_KEYCTL = {"x86_64": 250, "aarch64": 219}
_KEYCTL_SEARCH = 10
_KEYRINGS = (".secondary_trusted_keys", ".builtin_trusted_keys")
_PLATFORM = (".platform",)
_BLACKLIST = (".blacklist",)
_ALL_HASHES = frozenset(DIGESTS)  # reading a signer's key id, not judging its digest
# Where a trusted key sits, most specific first: `.secondary_trusted_keys` links the builtin
# keys and `.machine` (MOK keys, CONFIG_INTEGRITY_MACHINE_KEYRING), so those are asked before
# it; `.platform` (UEFI db, and MOK keys where there is no `.machine`) counts only through
# the distributions' fallback.
WHERE = (
    ("builtin", ".builtin_trusted_keys"),
    ("machine", ".machine"),
    ("secondary", ".secondary_trusted_keys"),
    ("platform", ".platform"),
)


def enforcing(layout: Layout) -> str | None:
    """Why the running kernel refuses unsigned or untrusted modules, or None if it does not.

    A file that is absent means the kernel lacks the feature (no module signatures, no
    lockdown). One that exists but cannot be read leaves the answer unknown: that is an
    :class:`OSError` naming the file, never "not enforcing" (intake then keeps the drop).
    """
    sig_enforce = _read(layout.sig_enforce)
    if sig_enforce is not None and sig_enforce.strip() == "Y":
        return "module.sig_enforce=1"
    lockdown = _read(layout.lockdown)
    for mode in ("integrity", "confidentiality"):
        if lockdown is not None and f"[{mode}]" in lockdown:
            return f"lockdown={mode}"
    return None


def _read(path: Path) -> str | None:
    """The file's text, None when it does not exist; any other failure names the file."""
    try:
        return path.read_text()
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise OSError(
            exc.errno,
            f"cannot tell whether the running kernel enforces module signatures: {exc.strerror}",
            str(path),
        ) from exc


class Keyring(Protocol):
    """The kernel's trusted keys, asked by key id (hex)."""

    def trusts(self, key_id: str, *, platform: bool = False) -> bool:
        """Whether a key with this exact id is one the kernel verifies modules against
        (``platform``: the ``.platform`` fallback counts too)."""

    def blacklisted(self, sha256: str) -> bool:
        """Whether a module with this sha256 (of the whole file the kernel reads) is refused."""

    def rings(self, key_id: str) -> frozenset[str]:
        """Every keyring that holds key ``ex:<key_id>``, by :data:`WHERE`'s labels."""


class KernelKeyring:
    """The running kernel's system keyrings, through /proc/keys and keyctl(2)."""

    def __init__(self, proc: Path) -> None:
        self.proc = proc
        self._libc = ctypes.CDLL(None, use_errno=True)

    def _keyring_ids(self, names: tuple[str, ...]) -> list[int]:
        ids = []
        for line in (self.proc / "keys").read_text().splitlines():
            fields = line.split()
            if len(fields) >= 9 and fields[7] == "keyring" and fields[8].rstrip(":") in names:
                ids.append(int(fields[0], 16))
        return ids

    def trusts(self, key_id: str, *, platform: bool = False) -> bool:
        """Search the system keyrings (then ``.platform``) for key ``ex:<key_id>``."""
        if self._search(_KEYRINGS, b"asymmetric", f"ex:{key_id}"):
            return True
        return platform and self._search(_PLATFORM, b"asymmetric", f"ex:{key_id}")

    def blacklisted(self, sha256: str) -> bool:
        """Search ``.blacklist`` for ``bin:<sha256>``, as ``mod_is_hash_blacklisted`` does."""
        return self._search(_BLACKLIST, b"blacklist", f"bin:{sha256}")

    def visible(self) -> bool:
        """Whether this process sees the system keyrings at all (root does)."""
        return bool(self._keyring_ids((".builtin_trusted_keys",)))

    def where(self, key_id: str) -> str | None:
        """Which keyring holds key ``ex:<key_id>``: ``builtin``, ``machine`` (MOK),
        ``secondary`` or ``platform`` (UEFI db; trusted for modules only by the
        distributions' fallback), None when none does."""
        for label, ring in WHERE:
            if self._search((ring,), b"asymmetric", f"ex:{key_id}"):
                return label
        return None

    def rings(self, key_id: str) -> frozenset[str]:
        """Every keyring of :data:`WHERE` that holds key ``ex:<key_id>``, by its label: a
        kernel that is not running shares some of them only (:mod:`.nextkeys`)."""
        found = (
            label for label, ring in WHERE if self._search((ring,), b"asymmetric", f"ex:{key_id}")
        )
        return frozenset(found)

    def descriptions(self) -> tuple[KeyDescription, ...]:
        """The asymmetric keys this process may view, as /proc/keys describes them."""
        return parse_proc_keys((self.proc / "keys").read_text())

    def _search(self, names: tuple[str, ...], key_type: bytes, description: str) -> bool:
        nr = _SYS_KEYCTL[os.uname().machine]
        for ring in self._keyring_ids(names):
            found = self._libc.syscall(nr, _KEYCTL_SEARCH, ring, key_type, description.encode(), 0)
            err = ctypes.get_errno()
            # The system keys grant root VIEW|READ but not SEARCH; the kernel matches a key
            # before it checks SEARCH, so EACCES means "a key with this id is there" and
            # ENOKEY "no such key" (security/keys/keyring.c, keyring_search_iterator).
            if found >= 0 or err == errno.EACCES:
                return True
            if err != errno.ENOKEY:
                raise OSError(err, os.strerror(err), "keyctl(KEYCTL_SEARCH)")
        return False


class KeyDescription(NamedTuple):
    """One asymmetric key of /proc/keys: ``x509_key_preparse``'s description split in its
    subject and hex id (the SKID, else the serial), and the last 4 bytes of its SKID in hex
    (``asymmetric_key_describe``; None: the certificate has no SKID)."""

    subject: str
    hex_id: str
    skid_tail: str | None


# "<subject>: <hex>" then public_key_describe's "X509.<algo>", the SKID's tail, " []"
_ASYMMETRIC = re.compile(
    r"(?P<subject>.*): (?P<id>[0-9a-f]+): X509\.\S+(?: (?P<tail>[0-9a-f]+))? \["
)


def parse_proc_keys(text: str) -> tuple[KeyDescription, ...]:
    """The asymmetric keys of a /proc/keys text (security/keys/proc.c: eight fields, the
    type cut to 9 characters, ``asymmetri``, then the type's description)."""
    found = []
    for line in text.splitlines():
        fields = line.split(None, 8)
        if len(fields) < 9 or fields[7] != "asymmetri":
            continue
        m = _ASYMMETRIC.match(fields[8])
        if m:
            found.append(KeyDescription(m["subject"], m["id"], m["tail"]))
    return tuple(found)


def name_in_keyring(keys: tuple[KeyDescription, ...], sid: SignerId) -> SignerName | None:
    """The kernel's own name for the key ``sid`` identifies, when /proc/keys ties one key to
    it: for an SKID, the key described by that SKID (whose SKID ends the same); for issuer
    and serial, the key without SKID described by that serial (the one whose subject is the
    issuer's name, if several are). None when no key, or more than one, fits: a key with an
    SKID shows only its SKID's last 4 bytes, so issuer and serial cannot be tied to it."""
    if sid.skid is not None:
        want, tail = sid.skid.hex(), sid.skid[-4:].hex()
        fits = [k for k in keys if k.hex_id == want and k.skid_tail == tail]
    elif sid.serial is not None and sid.issuer is not None:
        want = sid.serial.hex()
        fits = [k for k in keys if k.hex_id == want and k.skid_tail is None]
        if len({k.subject for k in fits}) > 1:
            issuer = issuer_name(sid.serial, sid.issuer)
            fits = [k for k in fits if k.subject == issuer]
    else:
        return None
    if len({k.subject for k in fits}) != 1:
        return None
    key = fits[0]
    issuer_dn = None if sid.issuer is None else distinguished_name(sid.issuer)
    return SignerName(
        f"{key.subject}: {key.hex_id}",
        issuer_dn,
        None if sid.serial is None else sid.serial.hex(),
        sid.skid.hex() if sid.skid is not None else None,
        "kernel keyring",
    )


#: The end of a module image kept to find its signature: a module's PKCS#7 (no certificates)
#: is a few hundred bytes; a larger one is reported as not found.
SIGNER_WINDOW = 64 << 10


def signer_key_id(path: Path) -> str | None:
    """The key id (hex) of the first signer of the module at ``path`` (:func:`module_signer`)."""
    found = module_signer(path)
    return None if found is None else found.key_id.hex()


def module_signer(path: Path) -> SignerId | None:
    """How the first signer of the module at ``path`` (decompressed first, as the kernel
    reads it) names its key, None when it is unsigned or its signature does not parse.

    Only the image's last :data:`SIGNER_WINDOW` bytes are held, whatever its size; the
    answer is kept per file (store files never change in place), so ``status`` and the
    daemon's metrics decompress a stored module once per process, not on every call.
    """
    st = path.stat()
    return _module_signer(path, st.st_size, st.st_mtime_ns)


@functools.lru_cache(maxsize=1024)
def _module_signer(path: Path, size: int, mtime_ns: int) -> SignerId | None:
    tail, image_len = _image_tail(path)
    try:
        trailer = parse_trailer(tail[-TAIL:], image_len)
        start = trailer.signed_len - (image_len - len(tail))
        if start < 0:
            return None
        blob = tail[start : start + trailer.sig_len]
        msg = parse_message(blob, rules=KernelRules.newest(_ALL_HASHES))
    except (ModuleRejected, Asn1Error):
        return None
    first = msg.signers[0]
    if first.skid_form:
        return SignerId(first.auth_id, skid=first.auth_id)
    return SignerId(first.auth_id, serial=first.raw_serial, issuer=first.raw_issuer)


def _image_tail(path: Path) -> tuple[bytes, int]:
    """The last :data:`SIGNER_WINDOW` bytes of the module image at ``path`` and its length."""
    with path.open("rb") as f:
        kind = compression(f.read(8))
        if kind is None:
            size = os.fstat(f.fileno()).st_size
            f.seek(max(0, size - SIGNER_WINDOW))
            return f.read(), size
        f.seek(0)
        tail, size = b"", 0
        for piece in chunks(f.read, kind):
            size += len(piece)
            tail = (tail + piece)[-SIGNER_WINDOW:]
        return tail, size

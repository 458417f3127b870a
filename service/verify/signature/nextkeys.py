"""Which signers a kernel that is installed but not running will trust, asked before the
reboot into it.

Only the running kernel's keyrings can be asked (``keyctl``), and only some of their keys are
the next kernel's too:

* ``.machine`` holds the MOKs (shim's ``MokListRT``), ``.platform`` the UEFI db (and the MOKs
  of a kernel without ``.machine``), ``.blacklist`` the dbx hashes: firmware and shim
  variables, which every kernel booted on this host loads again
  (``security/integrity/platform_certs/load_uefi.c``). A MOK signs modules for a kernel built
  with ``CONFIG_INTEGRITY_MACHINE_KEYRING`` (``.machine`` is linked into
  ``.secondary_trusted_keys``; with ``CONFIG_INTEGRITY_CA_MACHINE_KEYRING`` only a CA is let
  in, so that is not counted on) or with ``CONFIG_INTEGRITY_PLATFORM_KEYRING`` (a MOK
  ``.machine`` does not take lands in ``.platform``, which Debian's fallback asks on
  ``ENOKEY``); a db key only with the latter.
* ``.builtin_trusted_keys`` holds the certificates compiled into the running kernel's image:
  the next kernel trusts such a key only if its own image carries the same certificate
  (:func:`~service.verify.targetkernel.kimage.read_builtin_certificates`). A key in neither is
  trusted too when the next kernel's image carries it.
* a key ``.secondary_trusted_keys`` holds itself was added at run time (``keyctl padd``),
  which no boot keeps.

The next kernel enforces signatures when its config forces them (``CONFIG_MODULE_SIG_FORCE``,
a forced lockdown) or when the running kernel enforces: Secure Boot's lockdown and the boot
command line are the same for the next boot.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, replace
from pathlib import Path

from service.errors import TargetFileError, TrustError
from service.layout import Layout, kernel_image
from service.verify.signature.asn1 import Asn1Error
from service.verify.signature.keyring import Keyring, enforcing
from service.verify.signature.trust import TrustedKey, TrustStore
from service.verify.signature.x509 import parse_certificate
from service.verify.targetkernel.kernel import Target
from service.verify.targetkernel.kimage import read_builtin_certificates
from service.verify.targetkernel.rules import KernelRules, Symbol, row_of

#: the keyrings a key's name is given with, by :meth:`Keyring.rings`' labels
RING_NAMES = {
    "builtin": ".builtin_trusted_keys",
    "machine": ".machine (MOK)",
    "secondary": ".secondary_trusted_keys",
    "platform": ".platform (UEFI db)",
}
_FORCED = ("sig_force", "lockdown_integrity", "lockdown_confidentiality")  # KernelRules knobs


def next_enforcing(layout: Layout, target: Target) -> str | None:
    """Why kernel ``target`` will refuse modules it does not trust once booted, or None."""
    for knob in _FORCED:
        decided = row_of(knob).decided_by
        if getattr(target.rules, knob) and isinstance(decided, Symbol):
            return f"CONFIG_{decided.symbol} in {target.config.source}"
    why = enforcing(layout)
    if why is None:
        return None
    return f"{why} on the running kernel, which the same firmware and boot command line keep"


@dataclass(frozen=True)
class NextKeys:
    """What kernel ``target`` will let sign its modules, told from this host's files."""

    target: Target
    running: str  # the running kernel's release
    image: Path  # the target's image, whose built-in certificates are its own

    @property
    def mok(self) -> bool:
        """Whether a MOK signs modules for the target (module docstring)."""
        rules = self.target.rules
        return self.platform or (rules.machine_keyring and not rules.ca_machine_keyring)

    @property
    def platform(self) -> bool:
        """Whether a UEFI db key signs modules for the target (Debian's fallback)."""
        return self.target.rules.platform_keyring

    def shared(self, rings: frozenset[str]) -> bool:
        """Whether a key the running kernel holds in ``rings`` is trusted by the target
        through the keys every kernel on this host loads."""
        return ("machine" in rings and self.mok) or ("platform" in rings and self.platform)

    def refusal(self, why: str, key_id: str, signer: str | None, rings: frozenset[str],
                trust: TrustStore | None) -> str | None:  # fmt: skip
        """Why the target will refuse signing key ``key_id`` (held by the running kernel's
        ``rings``), None when it trusts it: a shared key, or one its own image carries."""
        if self.shared(rings):
            return None
        carried, unread = image_key_ids(self.image, self.target.rules)
        if key_id in carried:
            return None
        release = self.target.release
        name = f" ({signer})" if signer else ""
        head = f"EKEYREJECTED: kernel {release} ({why}) will not trust signing key {key_id}{name}: "
        return head + self._where(rings, unread) + ": " + self._remedy(key_id, trust)

    def _where(self, rings: frozenset[str], unread: str | None) -> str:
        """Where the running kernel holds the key, and why that does not serve the target;
        ``.secondary_trusted_keys`` last, as searching it finds the keys of the keyrings it
        links (``.builtin_trusted_keys``, ``.machine``) too."""
        running, release = self.running, self.target.release
        if unread is not None:
            image = f"the certificates built into {release} are unknown ({unread})"
        else:
            image = f"{self.image} does not carry it"
        if "builtin" in rings:
            return f"only the running kernel {running}'s .builtin_trusted_keys holds it and {image}"
        config = self.target.config.source
        if "machine" in rings:
            return (
                f"the running kernel's {RING_NAMES['machine']} holds it, but {release} lets no "
                "MOK sign modules (neither CONFIG_INTEGRITY_PLATFORM_KEYRING nor "
                f"CONFIG_INTEGRITY_MACHINE_KEYRING without a CA-only .machine, in {config}) "
                f"and {image}"
            )
        if "platform" in rings:
            return (
                f"the running kernel's {RING_NAMES['platform']} holds it, but {release} asks no "
                f".platform for modules (no CONFIG_INTEGRITY_PLATFORM_KEYRING in {config}) "
                f"and {image}"
            )
        if "secondary" in rings:
            return (
                f"only the running kernel {running}'s .secondary_trusted_keys holds it (added "
                f"at run time, which no boot keeps) and {image}"
            )
        return f"no keyring of the running kernel {self.running} holds it and {image}"

    def _remedy(self, key_id: str, trust: TrustStore | None) -> str:
        key = None if trust is None else trust.find(bytes.fromhex(key_id))
        certificate = key.source if key is not None else "<its certificate>"
        if self.mok:
            return (
                f"enroll it as a MOK: mokutil --import {certificate}, then reboot and confirm "
                "in MokManager (or add it to the UEFI db)"
                if self.platform
                else f"enroll it as a MOK: mokutil --import {certificate}, then reboot and "
                "confirm in MokManager"
            )
        return f"sign it with a key built into {self.image}"


def image_key_ids(image: Path, rules: KernelRules) -> tuple[frozenset[str], str | None]:
    """The key ids (hex) of the certificates built into the kernel image at ``image`` that a
    kernel with ``rules`` loads (its own X.509 parse: with ``key_usage`` a malformed keyUsage or
    basicConstraints keeps one out, as ``load_certificate_list`` logs "Problem loading"),
    and why they are unknown (None: they were read). Kept per file version: intake asks once
    per drop, and the image is decompressed whole to find them."""
    try:
        st = image.stat()
    except OSError as exc:
        return frozenset(), f"{image}: cannot read: {exc.strerror or exc}"
    parsing = replace(rules, hashes=frozenset(), ecdsa=True)  # its load, not a verification
    return _image_key_ids(image, st.st_size, st.st_mtime_ns, parsing)


@functools.lru_cache(maxsize=8)
def _image_key_ids(
    image: Path, size: int, mtime_ns: int, rules: KernelRules
) -> tuple[frozenset[str], str | None]:
    try:
        certificates = read_builtin_certificates(image)
    except TargetFileError as exc:
        return frozenset(), str(exc)
    ids: set[str] = set()
    for i, der in enumerate(certificates, 1):
        try:
            key = TrustedKey.from_der(der, f"{image} (built-in certificate {i})")
            parse_certificate(der, rules=rules)
        except (TrustError, Asn1Error):
            continue  # a certificate the kernel could not load trusts nothing
        ids.update(k.hex() for k in key.key_ids)
    return frozenset(ids), None


def next_refusals(
    why: str,
    layout: Layout,
    keyring: Keyring,
    target: Target,
    signers: dict[str, str | None],
    trust: TrustStore | None = None,
    *,
    running: str,
) -> list[str]:
    """Why kernel ``target``, installed and not running (``running`` is), will refuse the
    signers of a drop (key id: subject) once booted, enforcing for ``why``
    (:func:`next_enforcing`)."""
    keys = NextKeys(target, running, kernel_image(layout, target.release))
    reasons = []
    for key_id, signer in signers.items():
        reason = keys.refusal(why, key_id, signer, keyring.rings(key_id), trust)
        if reason is not None:
            reasons.append(reason)
    return reasons

"""The target kernel's per-release rules, as one table: which rule applies to a kernel.

Each :class:`Row` names a rule, the kernel function it mirrors, how it is decided (a config
symbol, or the release with the upstream or Debian commit that changed it), what is assumed
when the fact is unreadable, and the knob of :class:`KernelRules` it sets. A
:class:`KernelRules` is made once from a target's release and configuration
(:meth:`KernelRules.of`); the verify stack reads its knobs, never a release number or a
config symbol of its own. :meth:`KernelRules.newest` stands for "parse as the newest kernel
known" where no target is at hand (the host's trusted certificates, the running kernel's
keyrings). Adding a kernel is a reviewed set of rows here plus oracle cases.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, replace
from typing import NamedTuple

from service.verify.targetkernel.kconfig import KernelConfig

Version = tuple[int, int]

#: the version an unparseable release counts as: newer than every row
NEWEST: Version = (99, 0)
#: the oldest kernel modstage judges for (Debian 12's): before every row
OLDEST: Version = (6, 1)


class Since(NamedTuple):
    """The rule holds from ``release`` on (the kernel that ``commit`` first shipped in)."""

    release: Version
    commit: str

    def decide(self, version: Version) -> bool:
        """Whether a kernel of ``version`` applies the rule."""
        return version >= self.release


class Until(NamedTuple):
    """The rule holds before ``release`` (the kernel ``commit`` removed it from)."""

    release: Version
    commit: str

    def decide(self, version: Version) -> bool:
        """Whether a kernel of ``version`` applies the rule."""
        return version < self.release


class Symbol(NamedTuple):
    """The rule holds where ``CONFIG_<symbol>`` is ``y`` or ``m``."""

    symbol: str

    def decide(self, config: KernelConfig) -> bool:
        """Whether the kernel built with ``config`` applies the rule (a missing config
        answers with :meth:`KernelConfig.missing`'s assumptions)."""
        return config.enabled(self.symbol)


class Row(NamedTuple):
    """One rule of the table."""

    rule: str  # what the kernel does, in words
    mirrors: str  # the kernel functions the rule is modstage's copy of, comma-separated
    decided_by: Since | Until | Symbol
    unreadable: bool  # the knob's value when the release or config cannot be read
    knob: str  # the KernelRules field it sets


#: Every rule of the target kernel that a release or one config symbol decides.
ROWS: tuple[Row, ...] = (
    Row(
        "one .modinfo, one symbol table, an allocated .gnu.linkonce.this_module of "
        "sizeof(struct module)",
        "elf_validity_check",
        Since((6, 4), "Linux 6.4's elf_validity_check"),
        True,
        "elf_6_4",
    ),
    Row(
        "the name table's type, every section's name and the symbol table's link",
        "elf_validity_cache_copy",
        Since((6, 12), "Debian's 6.12 carries 6.13's elf_validity_cache_copy checks"),
        True,
        "elf_6_12",
    ),
    Row(
        "zstd among the formats the in-kernel decompressor may be built for",
        "module_decompress",
        Since((6, 2), "MODULE_COMPRESS_ZSTD decompression in Linux 6.2"),
        True,
        "zstd_decompress",
    ),
    Row(
        "SHA-3 digests, RSA and ECDSA with SHA-3 named by the PKCS#7 and X.509 parsers",
        "pkcs7_sig_note_digest_algo, x509_note_sig_algo",
        Since((6, 7), "2ee7c1bcf3d1, ee62afb9d02d"),
        True,
        "sha3",
    ),
    Row(
        "MD4 and MD5 named by the PKCS#7 and X.509 parsers",
        "pkcs7_sig_note_digest_algo, x509_note_sig_algo",
        Until((6, 7), '8468516f9f93 "crypto: pkcs7 - remove md4 md5 x.509 support"'),
        False,
        "md4_md5",
    ),
    Row(
        "SM2 keys and SM2-with-SM3 signatures named by the parsers",
        "pkcs7_sig_note_pkey_algo, x509_extract_key_data",
        Until((6, 11), '46b3ff73afc8 "crypto: sm2 - Remove sm2 algorithm"'),
        False,
        "sm2",
    ),
    Row(
        "X.509 keyUsage and basicConstraints read into the key's flags, a malformed one "
        "failing the parse",
        "x509_process_extension",
        Since(
            (6, 4),
            '30eae2b037af "KEYS: X.509: Parse Basic Constraints for CA", '
            '567671281a75 "KEYS: X.509: Parse Key Usage"',
        ),
        True,
        "key_usage",
    ),
    Row(
        "ML-DSA named by the PKCS#7 parser",
        "pkcs7_sig_note_pkey_algo",
        Since((7, 0), "ML-DSA in the PKCS#7 and X.509 parsers, Linux 7.0"),
        True,
        "ml_dsa",
    ),
    Row(
        "a module's __ksymtab_gpl and __kcrctab_gpl ignored: what it exports there does not "
        "exist for the modules after it",
        "find_module_sections",
        Since((7, 1), 'b4760ff2a5e4 "module: deprecate usage of *_gpl sections in module loader"'),
        True,
        "gpl_section_ignored",
    ),
    Row(
        "an init's EEXIST returned as EBUSY, so that EEXIST names only a module already loaded",
        "do_init_module",
        Since((7, 1), '743f8cae549a "module: Override -EEXIST module return"'),
        True,
        "init_eexist_is_ebusy",
    ),
    Row(
        "a module's .BTF parsed as split BTF over the kernel's own as the module comes",
        "btf_module_notify, btf_parse_module",
        Symbol("DEBUG_INFO_BTF_MODULES"),
        False,
        "module_btf",
    ),
    Row(
        "a module whose .BTF the kernel cannot parse loads anyway, with a warning",
        "btf_module_notify",
        Symbol("MODULE_ALLOW_BTF_MISMATCH"),
        False,
        "btf_mismatch_allowed",
    ),
    Row(
        "a module whose SHA-256 is in .blacklist (the firmware's dbx) refused",
        "mod_is_hash_blacklisted",
        Until((6, 17), "Debian's \"Don't longer use UEFI DBX for module denylisting\""),
        False,
        "hash_denylist",
    ),
    Row(
        "a module with no __versions force-loaded (tainted), a module without vermagic too",
        "check_version, check_modinfo",
        Symbol("MODULE_FORCE_LOAD"),
        False,
        "force_load",
    ),
    Row(
        "a namespaced export used without its import",
        "verify_namespace_is_imported",
        Symbol("MODULE_ALLOW_MISSING_NAMESPACE_IMPORTS"),
        False,
        "missing_ns_ok",
    ),
    Row(
        "a writable and executable section refused",
        "module_enforce_rwx_sections",
        Symbol("STRICT_MODULE_RWX"),
        True,
        "strict_rwx",
    ),
    Row(
        "an EC key in a keyring, an ECDSA signature verified",
        "ecdsa_verify",
        Symbol("CRYPTO_ECDSA"),
        False,
        "ecdsa",
    ),
    Row(
        "an ML-DSA module signature verified",
        "public_key_verify_signature",
        Symbol("CRYPTO_MLDSA"),
        False,
        "mldsa",
    ),
    Row(
        "the .platform keyring (UEFI db) a fallback for module signatures (Debian's)",
        "mod_verify_sig",
        Symbol("INTEGRITY_PLATFORM_KEYRING"),
        False,
        "platform_keyring",
    ),
    Row(
        "MOK keys in the .machine keyring, which links into the secondary trusted keys",
        "set_machine_trusted_keys",
        Symbol("INTEGRITY_MACHINE_KEYRING"),
        False,
        "machine_keyring",
    ),
    Row(
        "only CA certificates admitted to the .machine keyring",
        "restrict_link_by_ca",
        Symbol("INTEGRITY_CA_MACHINE_KEYRING"),
        False,
        "ca_machine_keyring",
    ),
    Row(
        "an unsigned or untrusted module refused whatever the boot command line says",
        "module_sig_check",
        Symbol("MODULE_SIG_FORCE"),
        False,
        "sig_force",
    ),
    Row(
        "lockdown forced to integrity: an untrusted module refused",
        "lockdown_lsm_init",
        Symbol("LOCK_DOWN_KERNEL_FORCE_INTEGRITY"),
        False,
        "lockdown_integrity",
    ),
    Row(
        "lockdown forced to confidentiality: an untrusted module refused",
        "lockdown_lsm_init",
        Symbol("LOCK_DOWN_KERNEL_FORCE_CONFIDENTIALITY"),
        False,
        "lockdown_confidentiality",
    ),
)


def row_of(knob: str) -> Row:
    """The row that sets ``knob``."""
    return next(row for row in ROWS if row.knob == knob)


#: digest name -> the config symbol (without ``CONFIG_``) that builds it (y or m)
DIGESTS = {
    "md4": "CRYPTO_MD4",
    "md5": "CRYPTO_MD5",
    "sha1": "CRYPTO_SHA1",
    "sha224": "CRYPTO_SHA256",
    "sha256": "CRYPTO_SHA256",
    "sha384": "CRYPTO_SHA512",
    "sha512": "CRYPTO_SHA512",
    "sm3": "CRYPTO_SM3",
    "streebog256": "CRYPTO_STREEBOG",
    "streebog512": "CRYPTO_STREEBOG",
    "sha3_256": "CRYPTO_SHA3",  # named by the parsers from 6.7 (the sha3 row)
    "sha3_384": "CRYPTO_SHA3",
    "sha3_512": "CRYPTO_SHA3",
}


def version_of(release: str) -> Version:
    """(major, minor) of ``release``; an unparseable one counts as :data:`NEWEST`."""
    match = re.match(r"(\d+)\.(\d+)", release)
    return (int(match[1]), int(match[2])) if match else NEWEST


@dataclass(frozen=True)
class KernelRules:
    """Which of the kernel's rules a target applies: one knob per :data:`ROWS` row, plus
    the digests it can compute and whether it has modversions."""

    release: str
    version: Version
    hashes: frozenset[str]  # digest names the kernel can allocate (DIGESTS)
    modversions: bool | None  # CONFIG_MODVERSIONS; None: no config read
    elf_6_4: bool
    elf_6_12: bool
    zstd_decompress: bool
    sha3: bool
    md4_md5: bool
    sm2: bool
    key_usage: bool
    ml_dsa: bool
    gpl_section_ignored: bool
    init_eexist_is_ebusy: bool
    module_btf: bool
    btf_mismatch_allowed: bool
    hash_denylist: bool
    force_load: bool
    missing_ns_ok: bool
    strict_rwx: bool
    ecdsa: bool
    mldsa: bool
    platform_keyring: bool
    machine_keyring: bool
    ca_machine_keyring: bool
    sig_force: bool
    lockdown_integrity: bool
    lockdown_confidentiality: bool

    @classmethod
    def of(cls, release: str, config: KernelConfig) -> KernelRules:
        """The rules of the kernel ``release`` built with ``config``."""
        version = version_of(release)
        knobs = {
            row.knob: (
                row.decided_by.decide(config)
                if isinstance(row.decided_by, Symbol)
                else row.decided_by.decide(version)
            )
            for row in ROWS
        }
        return cls(
            release,
            version,
            frozenset(h for h, symbol in DIGESTS.items() if config.enabled(symbol)),
            config.enabled("MODVERSIONS") if config.known else None,
            **knobs,
        )

    @classmethod
    def parser(
        cls, version: Version, hashes: frozenset[str] = frozenset(), *, ecdsa: bool = True
    ) -> KernelRules:
        """The rules of a kernel of ``version`` (its config unread) that computes ``hashes``
        and, with ``ecdsa``, holds EC keys: how its parsers read a certificate or signature."""
        symbols = "CONFIG_CRYPTO_ECDSA=y\n" if ecdsa else ""
        rules = cls.of(f"{version[0]}.{version[1]}", KernelConfig.parse(symbols, "assumed"))
        return replace(rules, hashes=hashes, modversions=None)

    @classmethod
    def newest(cls, hashes: frozenset[str] = frozenset()) -> KernelRules:
        """The newest kernel known, with EC keys and ``hashes``: how a certificate or
        signature is parsed where no target decides (no digest computed by default)."""
        return cls.parser(NEWEST, hashes)

    @classmethod
    def oldest(cls, hashes: frozenset[str] = frozenset()) -> KernelRules:
        """The oldest kernel modstage judges for (:data:`OLDEST`), as :meth:`newest`: its
        parsers still know what later ones dropped (SM2, MD4, MD5)."""
        return cls.parser(OLDEST, hashes)

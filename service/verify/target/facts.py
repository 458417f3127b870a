"""Every fact about the target kernel a verdict depends on: where it is read, and what
modstage does when it cannot be read.

Each is read from the target's own files (its image, config, module tree, or the running
kernel's /sys) where the kernel has a file or a config symbol that says it; the release
number decides only what the kernel changed without one, from the release that changed it.
``docs/verify.md`` ("Target kernel facts") shows the same table; ``tests/test_docs.py``
checks that the two name the same facts.
"""

from __future__ import annotations

from typing import NamedTuple


class Fact(NamedTuple):
    """One fact about the target kernel."""

    name: str
    read_from: str
    unreadable: str


#: The image and config are looked for in ``/boot`` first, then in the module tree
#: (``/usr/lib/modules/<release>/``: Debian's 7.2 packages install nothing in ``/boot``).
FACTS = (
    Fact(
        "kernel files",
        "boot/vmlinuz-<release> and boot/config-<release>, else vmlinuz and config in "
        "lib/modules/<release>/ (or usr/lib/modules/<release>/)",
        "the /boot path is named in notes; each fact below says what is assumed",
    ),
    Fact(
        "vermagic",
        "vermagic= of the first in-tree module under lib/modules/<release>/kernel",
        "every module is refused (policy): same_magic cannot be applied",
    ),
    Fact(
        "modversions",
        "CONFIG_MODVERSIONS in the config: with it same_magic skips the release word of a "
        "module with __versions and check_version compares CRCs; without it (7.2) neither",
        "CRCs are compared where known; a module built for another release is refused (policy)",
    ),
    Fact(
        "digests",
        "CONFIG_CRYPTO_MD4/MD5/SHA1/SHA256/SHA512/SHA3/SM3/STREEBOG (y or m)",
        "sha224, sha256, sha384 and sha512 only",
    ),
    Fact(
        "signature key types",
        "CONFIG_CRYPTO_RSA (always), CONFIG_CRYPTO_ECDSA; ML-DSA has no verifier unless "
        "CONFIG_CRYPTO_MLDSA",
        "RSA only",
    ),
    Fact(
        "parser algorithms",
        "the release of each upstream change: SHA-3 digests, RSA and ECDSA with SHA-3 from 6.7, "
        "MD4 and MD5 until 6.7, SM2 until 6.11 (no config symbol says which OIDs a parser "
        "knows)",
        "an unparseable release is judged as the newest known",
    ),
    Fact(
        "ELF validation",
        "the release: 6.4 on (one .modinfo, one symbol table, this_module's size), 6.12 on "
        "(Debian's 6.12 carries 6.13's elf_validity checks), no config symbol",
        "an unparseable release is judged as the newest known",
    ),
    Fact(
        "sizeof(struct module)",
        "the size of .gnu.linkonce.this_module in the in-tree module read for the vermagic",
        "not checked",
    ),
    Fact(
        "in-kernel decompression",
        "CONFIG_MODULE_DECOMPRESS and the one CONFIG_MODULE_COMPRESS_GZIP/XZ/ZSTD it builds "
        "(ZSTD from 6.2)",
        "none: boot hands a compressed module over decompressed",
    ),
    Fact(
        "built-in modules",
        "lib/modules/<release>/modules.builtin",
        "none known",
    ),
    Fact(
        "/sys/module names of built-in code",
        "the running kernel's /sys/module (directories without initstate) when the release is the "
        "running one; else the image's __param prefixes and __modver module names",
        "a modules.builtin name is refused (policy)",
    ),
    Fact(
        "export flags and module namespaces",
        "the image: a __kflagstab section (7.2: every export's GPL-only flag; a module "
        "exporting symbols must carry one); the loader's own message for an explicit import "
        "of a module: namespace, present only where it admits the modules such a namespace "
        "names (7.2; not Debian's 6.12, which exports in module:kvm all the same)",
        "not judged: the kernel decides at load (boot reads no exports)",
    ),
    Fact(
        "exported symbols",
        "the image's __ksymtab*/__kcrctab* and every in-tree module, cross-checked with "
        "build/Module.symvers where the headers are installed (cached per release)",
        "Module.symvers alone; with neither, a module importing an unknown symbol is refused "
        "(policy)",
    ),
    Fact(
        "module-hash denylist",
        "the release: Debian's kernels refuse a module whose SHA-256 is in .blacklist (dbx) "
        "until 6.17, which dropped that patch; no config symbol",
        "an unparseable release is judged as the newest known (no check: refused as policy)",
    ),
    Fact(
        "keyrings",
        "CONFIG_INTEGRITY_PLATFORM_KEYRING (the .platform fallback), the running kernel's "
        "/proc/keys for the intake pre-flight; for a kernel that is not running, also "
        "CONFIG_INTEGRITY_MACHINE_KEYRING, CONFIG_INTEGRITY_CA_MACHINE_KEYRING, "
        "CONFIG_MODULE_SIG_FORCE, CONFIG_LOCK_DOWN_KERNEL_FORCE_* and the certificates built "
        "into its image (service.verify.signature.nextkeys)",
        "no .platform fallback; for a kernel that is not running, no MOK either, and an "
        "unreadable image carries no key",
    ),
)

"""The differential generator: a seeded, reproducible list of module cases, one name each.

`generate(pki, workdir, seed)` returns `Case`s in categories (baseline, ecdsa, keys, signers,
pkcs7, trailer, elf, modinfo, compress, random, symbols). Signatures are real: kbuild's
sign-file for what it can express, `tests.oracle.cms` otherwise; hand-made bytes only as
deliberately broken input. Keys are cached (tests/oracle/pki.py), RSA PKCS#1 v1.5 and ECDSA (RFC 6979)
are deterministic, so the same seed gives the same bytes.
"""

from __future__ import annotations

import datetime as dt
import gzip
import lzma
import random
import re
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path

import zstandard
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization

from tests.kmod.forge import append_signature, compress, split
from tests.oracle import der, elf
from tests.oracle.cms import ATTR_SIGNING_TIME, ATTR_SMIME_CAPS, Cms, Signer, build, cert_parts
from tests.oracle.module import base_module, module_name, renamed, symbols_module
from tests.oracle.pki import CHAIN, SECONDARY, Pki, reissue
from tests.oracle.testbed import sign_file

SEED = 11
SUFFIX = {"": ".ko", "xz": ".ko.xz", "gz": ".ko.gz", "zst": ".ko.zst"}


@dataclass(frozen=True)
class Case:
    """One module file to judge; `compressed` is the stream kind inside ("" = plain ELF)."""

    id: str
    category: str
    name: str
    data: bytes
    suffix: str = ".ko"
    compressed: str = ""
    stem: str = ""  # the file's name before the suffix, when not the module's name

    @property
    def filename(self) -> str:
        """The file name the case is written under (its stem or module name + suffix)."""
        return (self.stem or self.name) + self.suffix


class Generator:
    """Allocates module names and collects cases; one instance per generated list."""

    def __init__(self, pki: Pki, workdir: Path, seed: int) -> None:
        self.pki, self.workdir, self.rng = pki, workdir, random.Random(seed)
        self.base, self.symbols = base_module(), symbols_module()
        self.cases: list[Case] = []
        self.ids: set[str] = set()
        # who signs when a case names no one: the CA where it is RSA (Debian 12's slot), else
        # an RSA-2048 leaf the CA issued, in the secondary keyring (see pki.ca_kind)
        self.default = "rsa2048" if pki.ca.is_ec else "ca"

    def payload(self) -> bytes:
        """The next case's unsigned module (fresh name)."""
        return renamed(self.base, len(self.cases) + 1)

    def symbols_payload(self) -> bytes:
        """The next case's unsigned symbols module (fresh name)."""
        return renamed(self.symbols, len(self.cases) + 1)

    def add(
        self, category: str, label: str, data: bytes, compressed: str = "", suffix: str = ""
    ) -> None:
        """Record a case built from `self.payload()` (name = next index)."""
        case_id = f"{category}/{label}"
        assert case_id not in self.ids, case_id
        self.ids.add(case_id)
        name = module_name(len(self.cases) + 1)
        self.cases.append(
            Case(case_id, category, name, data, suffix or SUFFIX[compressed], compressed)
        )

    def sign_file(
        self, payload: bytes, cred: str = "", hash: str = "sha256", skid: bool = False
    ) -> bytes:
        """`payload` signed by kbuild's sign-file (`cred` default: `self.default`)."""
        cred = cred or self.default
        return sign_file(payload, self.pki[cred], self.workdir / "sign.ko", hash, skid)

    def cms(self, payload: bytes, cms: Cms) -> bytes:
        """`payload` with the PKCS#7 `cms` appended as a module signature."""
        return append_signature(payload, build(cms, payload))

    def signer(self, cred: str = "", **kw: object) -> Signer:
        """A Signer for the credential called `cred` (default: `self.default`)."""
        cred = cred or self.default
        if isinstance(kw.get("cert"), str):
            kw["cert"] = self.pki[str(kw["cert"])]
        return Signer(self.pki[cred], **kw)  # type: ignore[arg-type]

    def good(self) -> bytes:
        """The next payload signed by `self.default` (the CA) with sign-file (sha256)."""
        return self.sign_file(self.payload())


def baseline(g: Generator) -> None:
    """sign-file with every RSA key the kernel trusts, every SHA-2 digest, both sid kinds."""
    for cred in ("ca", *SECONDARY):
        for hash in ("sha224", "sha256", "sha384", "sha512"):
            for skid in (False, True):
                label = f"{cred}-{hash}-{'skid' if skid else 'issuer'}"
                g.add("baseline", label, g.sign_file(g.payload(), cred, hash, skid))
    for hash in ("sha3-256", "sha3-384", "sha3-512", "sha1"):
        for skid in (False, True):
            g.add(
                "baseline",
                f"ca-{hash}-{'skid' if skid else 'issuer'}",
                g.sign_file(g.payload(), "ca", hash, skid),
            )
    g.add("baseline", "ca-md5-cms", g.cms(g.payload(), Cms((g.signer(digest="md5"),))))


def ecdsa(g: Generator) -> None:
    """EC keys (in the secondary keyring, unusable without CONFIG_CRYPTO_ECDSA)."""
    for cred in ("p256", "p384"):
        for hash in ("sha256", "sha384", "sha512"):
            for sid in ("issuer", "skid"):
                g.add(
                    "ecdsa",
                    f"{cred}-{hash}-{sid}",
                    g.cms(g.payload(), Cms((g.signer(cred, digest=hash, sid=sid),))),
                )
    for hash in ("sha3-256", "sha3-384", "sha3-512"):
        g.add(
            "ecdsa",
            f"p256-ecdsa-with-{hash}",
            g.cms(g.payload(), Cms((g.signer("p256", digest=hash),))),
        )
    g.add(
        "ecdsa",
        "p256-ecdsa-with-SHA1",
        g.cms(g.payload(), Cms((g.signer("p256", digest="sha1", sig_alg="ecdsa-with-SHA1"),))),
    )
    for cred in ("p256", "p384"):
        g.add(
            "ecdsa",
            f"{cred}-ber-signature",
            g.cms(g.payload(), Cms((g.signer(cred, ber_signature=True),))),
        )
    chain = g.pki["chainp256"].der
    g.add(
        "ecdsa",
        "chainp256-embedded",
        g.cms(g.payload(), Cms((g.signer("chainp256"),), certs=(chain,))),
    )
    g.add(
        "ecdsa",
        "rsa-key-ecdsa-oid",
        g.cms(g.payload(), Cms((g.signer(sig_alg="ecdsa-with-sha256"),))),
    )


def keys(g: Generator) -> None:
    """Embedded certificates and chains, untrusted and forged keys."""
    for cred in CHAIN:
        if cred.endswith("p256"):
            continue
        for hash in ("sha256", "sha512"):
            cms = Cms((g.signer(cred, digest=hash),), certs=(g.pki[cred].der,))
            g.add("keys", f"{cred}-embedded-{hash}", g.cms(g.payload(), cms))
        g.add("keys", f"{cred}-not-embedded", g.cms(g.payload(), Cms((g.signer(cred),))))
        skid = Cms((g.signer(cred, sid="skid"),), certs=(g.pki[cred].der,))
        g.add("keys", f"{cred}-embedded-skid", g.cms(g.payload(), skid))
    inter, leaf = g.pki["inter"].der, g.pki["interleaf"].der
    g.add(
        "keys",
        "interleaf-chain",
        g.cms(g.payload(), Cms((g.signer("interleaf"),), certs=(leaf, inter))),
    )
    g.add(
        "keys",
        "interleaf-chain-reversed",
        g.cms(g.payload(), Cms((g.signer("interleaf"),), certs=(inter, leaf))),
    )
    g.add(
        "keys",
        "interleaf-no-intermediate",
        g.cms(g.payload(), Cms((g.signer("interleaf"),), certs=(leaf,))),
    )
    g.add("keys", "forged-issuer-serial", g.cms(g.payload(), Cms((g.signer("forged"),))))
    g.add(
        "keys",
        "forged-embedded",
        g.cms(g.payload(), Cms((g.signer("forged"),), certs=(g.pki["forged"].der,))),
    )
    g.add("keys", "stranger-sign-file", g.sign_file(g.payload(), "stranger"))
    g.add(
        "keys",
        "stranger-embedded",
        g.cms(g.payload(), Cms((g.signer("stranger"),), certs=(g.pki["stranger"].der,))),
    )
    g.add("keys", "ca-embedded", g.cms(g.payload(), Cms((g.signer(),), certs=(g.pki.ca.der,))))
    g.add(
        "keys",
        "unrelated-cert-embedded",
        g.cms(g.payload(), Cms((g.signer(),), certs=(g.pki["stranger"].der,))),
    )
    g.add(
        "keys", "leaf-named-by-ca-cert", g.cms(g.payload(), Cms((g.signer("rsa2048", cert="ca"),)))
    )


def signers(g: Generator) -> None:
    """Several SignerInfos in various orders: good, bad (found key, wrong signature), unknown."""
    kinds = {
        "good": lambda: g.signer(),
        "good3072": lambda: g.signer("rsa3072", digest="sha384"),
        "goodskid": lambda: g.signer("rsa4096", sid="skid"),
        "bad": lambda: g.signer("rsa2048", bad_signature=True),
        "unknown": lambda: g.signer("stranger"),
        "ec": lambda: g.signer("p256"),
        "odd": lambda: g.signer("rsa2040"),
    }
    orders = [
        ("good", "unknown"), ("unknown", "good"), ("good", "bad"), ("bad", "good"),
        ("good", "good3072"), ("unknown", "unknown"), ("bad", "unknown"), ("unknown", "bad"),
        ("good", "ec"), ("ec", "good"), ("good", "odd"), ("odd", "good"),
        ("good", "goodskid"), ("goodskid", "good"), ("good", "good3072", "bad"),
        ("unknown", "good", "unknown"), ("good", "good"),
    ]  # fmt: skip
    for order in orders:
        cms = Cms(tuple(kinds[k]() for k in order))
        g.add("signers", "+".join(order), g.cms(g.payload(), cms))


def _crl(g: Generator, revoked: int | None) -> bytes:
    builder = (
        x509.CertificateRevocationListBuilder()
        .issuer_name(g.pki.ca.cert.subject)
        .last_update(dt.datetime(2024, 1, 1, tzinfo=dt.UTC))
        .next_update(dt.datetime(2100, 1, 1, tzinfo=dt.UTC))
    )
    if revoked is not None:
        entry = x509.RevokedCertificateBuilder().serial_number(revoked)
        builder = builder.add_revoked_certificate(
            entry.revocation_date(dt.datetime(2024, 1, 1, tzinfo=dt.UTC)).build()
        )
    crl = builder.sign(g.pki.ca.key, hashes.SHA256())  # type: ignore[arg-type]
    return crl.public_bytes(serialization.Encoding.DER)


def pkcs7(g: Generator) -> None:
    """The SignedData structure: versions, types, encodings, attributes, certs, CRLs, sizes."""
    s = g.signer
    variants: dict[str, Cms] = {
        "outer-oid-data": Cms((s(),), outer_oid="1.2.840.113549.1.7.1"),
        "content-type-signeddata": Cms((s(),), content_oid="1.2.840.113549.1.7.2"),
        "content-attached": Cms((s(),), attached=b"modstage"),
        "digest-set-empty": Cms((s(),), digest_algorithms=()),
        "digest-set-other": Cms((s(),), digest_algorithms=("sha512",)),
        "digest-params-null": Cms((s(digest_params_null=True),)),
        "digest-params-null-sha384": Cms((s(digest="sha384", digest_params_null=True),)),
        "sig-sha256WithRSA": Cms((s(sig_alg="sha256WithRSAEncryption"),)),
        "sig-rsassa-pss": Cms((s(sig_alg="rsassa-pss"),)),
        "sig-rsa-with-sha3-256": Cms((s(digest="sha3-256", sig_alg="rsa-with-sha3-256"),)),
        "signerinfos-sequence": Cms((s(),), signers_tag=0x30),
        "signerinfos-sequence-two": Cms((s(), s("rsa3072")), signers_tag=0x30),
        "issuer-indefinite": Cms((s(issuer_indefinite=True),)),
        "issuer-indefinite-rsa2048": Cms((s("rsa2048", issuer_indefinite=True),)),
        "issuer-length-1-octet": Cms((s(issuer_octets=1),)),
        "issuer-length-2-octets": Cms((s(issuer_octets=2),)),
        "issuer-length-3-octets": Cms((s(issuer_octets=3),)),
        "outer-length-3-octets": Cms((s(),), outer_octets=3),
        "outer-length-4-octets": Cms((s(),), outer_octets=4),
        "trailing-zero-byte": Cms((s(),), extra=b"\0"),
        "trailing-junk": Cms((s(),), extra=b"junk!"),
        "trailing-eoc": Cms((s(),), extra=b"\0\0"),
        "certs-after-signerinfos": Cms((s(),), certs=(g.pki.ca.der,), field_order_swap=True),
        "attrs-minimal": Cms((s(attrs=()),)),
        "attrs-wrong-digest": Cms((s(attrs=(der.seq(der.oid("1.2.840.113549.1.9.4"), der.set_of(der.octets(b"\0" * 32))),)),)),
        "attrs-signing-time": Cms((s(attrs=_attrs_with(g, ATTR_SIGNING_TIME)),)),
        "attrs-smime-caps": Cms((s(attrs=_attrs_with(g, ATTR_SMIME_CAPS)),)),
        "unsigned-attrs": Cms((s(unsigned_attrs=der.seq(der.oid("1.2.3.4"), der.set_of(der.null()))),)),
        "crl-empty": Cms((s(),), crls=(_crl(g, None),)),
        "crl-revokes-signer": Cms((s("rsa2048"),), crls=(_crl(g, 102),)),
        "crl-malformed": Cms((s(),), crls=(der.seq(der.integer(1)),)),
        "cert-malformed": Cms((s(),), certs=(der.seq(der.integer(1), der.null()),)),
        "cert-truncated": Cms((s(),), certs=(der.reencode(g.pki.ca.der)[:-1],)),
        "cert-duplicated": Cms((s(),), certs=(g.pki.ca.der, g.pki.ca.der)),
        "blob-over-65535-certs": Cms((s(),), certs=(g.pki["rsa4096"].der,) * 66),
        "blob-under-65535-certs": Cms((s(),), certs=(g.pki["rsa1024"].der,) * 96),
        "blob-over-65535-unsigned-attr": Cms((s(unsigned_attrs=der.seq(der.oid("1.2.3.4"), der.set_of(der.octets(b"\xaa" * 70000)))),)),
        "sd-version-mix-v1-v3": Cms((s(), s("rsa4096", sid="skid")), sd_version=1),
    }  # fmt: skip
    for version in (0, 2, 4, 5):
        variants[f"sd-version-{version}"] = Cms((s(),), sd_version=version)
    variants["si-v3-issuer"] = Cms((s(version=3),), sd_version=3)
    variants["si-v1-skid"] = Cms((s(sid="skid", version=1),), sd_version=1)
    variants["si-v3-skid-sd-v1"] = Cms((s(sid="skid"),), sd_version=1)
    variants["si-v1-issuer-sd-v3"] = Cms((s(),), sd_version=3)
    for label, cms in variants.items():
        g.add("pkcs7", label, g.cms(g.payload(), cms))


def _attrs_with(g: Generator, extra_oid: str) -> tuple[bytes, ...]:
    value = der.tlv(0x17, b"240101000000Z") if extra_oid == ATTR_SIGNING_TIME else der.seq()
    return (
        der.seq(der.oid("1.2.840.113549.1.9.3"), der.set_of(der.oid("1.2.840.113549.1.7.1"))),
        der.seq(der.oid(extra_oid), der.set_of(value)),
    )


def trailer(g: Generator) -> None:
    """The 12-byte module_signature, the marker, and byte damage to signed modules."""
    fields = {
        "sig-len-plus-1": {"sig_len": 1}, "sig-len-minus-1": {"sig_len": -1},
        "id-type-0": {"id_type": 0}, "id-type-1": {"id_type": 1}, "id-type-3": {"id_type": 3},
        "algo-1": {"algo": 1}, "hash-1": {"hash": 1}, "signer-len-1": {"signer_len": 1},
        "key-id-len-1": {"key_id_len": 1}, "pad-nonzero": {"pad": b"\0\1\0"},
    }  # fmt: skip
    for label, change in fields.items():
        signed = split(g.good())
        if "sig_len" in change:
            change = {"sig_len": len(signed.blob) + int(change["sig_len"])}  # type: ignore[call-overload]
        g.add("trailer", label, replace(signed, **change).to_bytes())  # type: ignore[arg-type]
    good = g.good()
    g.add("trailer", "sig-len-0", replace(split(good), sig_len=0).to_bytes())
    good = g.good()
    g.add("trailer", "sig-len-whole-file", replace(split(good), sig_len=len(good)).to_bytes())
    g.add("trailer", "unsigned", g.payload())
    g.add("trailer", "marker-cut-1", g.good()[:-1])
    g.add("trailer", "marker-only", g.payload() + b"~Module signature appended~\n")
    g.add("trailer", "signed-twice", g.sign_file(g.good()))
    signed = split(g.good())
    g.add("trailer", "blob-truncated-10", replace(signed, blob=signed.blob[:-10]).to_bytes())
    signed = split(g.good())
    g.add(
        "trailer",
        "blob-half",
        replace(signed, blob=signed.blob[: len(signed.blob) // 2]).to_bytes(),
    )
    donor = g.sign_file(renamed(g.base, 99999))
    signed = split(g.good())
    g.add("trailer", "grafted", replace(signed, blob=split(donor).blob).to_bytes())
    for i in range(8):
        data = bytearray(g.good())
        size = len(split(bytes(data)).payload)
        at = g.rng.randrange(size)
        data[at] ^= 1 << g.rng.randrange(8)
        g.add("trailer", f"payload-bitflip-{i}-at-{at}", bytes(data))
    for i in range(6):
        signed = split(g.good())
        blob = bytearray(signed.blob)
        at = g.rng.randrange(len(blob))
        blob[at] ^= 1 << g.rng.randrange(8)
        g.add("trailer", f"blob-bitflip-{i}-at-{at}", replace(signed, blob=bytes(blob)).to_bytes())


def elf_cases(g: Generator) -> None:
    """ELF header and section mutations, signed after the change (so the ELF checks decide)."""
    W, A, X = elf.SHF_WRITE, elf.SHF_ALLOC, elf.SHF_EXECINSTR
    edits: dict[str, Callable[[bytes], bytes]] = {
        "no-symtab": lambda e: elf.set_section(e, ".symtab", type=1),
        "symtab-link-0": lambda e: elf.set_section(e, ".symtab", link=0),
        "symtab-link-out-of-range": lambda e: elf.set_section(e, ".symtab", link=500),
        "section0-addr": lambda e: elf.set_section(e, 0, addr=0x1000),
        "section0-size": lambda e: elf.set_section(e, 0, size=16),
        "wx-init-text": lambda e: elf.set_section(e, ".init.text", flags=A | X | W),
        "wx-data": lambda e: elf.set_section(e, ".data", flags=A | X | W),
        "wx-rodata-exec": lambda e: elf.set_section(e, ".modinfo", flags=A | X),
        "this-module-no-alloc": lambda e: elf.set_section(e, ".gnu.linkonce.this_module", flags=W),
        "this-module-missing": lambda e: elf.set_section(
            e, ".gnu.linkonce.this_module", name=elf.sections(e)[elf.index_of(e, ".zdecoy")]["name"]
        ),  # type: ignore[arg-type]
        "decoy-modinfo": _decoy,
        "modinfo-no-alloc": lambda e: elf.set_section(e, ".modinfo", flags=0),
        "modinfo-unterminated": lambda e: elf.set_section(
            e, ".modinfo", size=elf.section_data(e, ".modinfo")[1] - 1
        ),
        "ei-class-32": lambda e: elf.set_ident(e, 4, 1),
        "ei-data-msb": lambda e: elf.set_ident(e, 5, 2),
        "ei-version-0": lambda e: elf.set_ident(e, 6, 0),
        "ei-osabi-3": lambda e: elf.set_ident(e, 7, 3),
        "e-type-dyn": lambda e: elf.set_header(e, "type", 3),
        "e-machine-i386": lambda e: elf.set_header(e, "machine", 3),
        "e-shentsize-32": lambda e: elf.set_header(e, "shentsize", 32),
        "e-shstrndx-out-of-range": lambda e: elf.set_header(e, "shstrndx", 900),
        "shstrtab-progbits": lambda e: elf.set_section(e, ".shstrtab", type=1),
        "section-beyond-file": lambda e: elf.set_section(e, ".comment", offset=1 << 30),
        "not-elf": lambda e: b"\x7fELG" + e[4:],
    }
    for label, edit in edits.items():
        g.add("elf", label, g.sign_file(edit(g.payload())))


def _decoy(e: bytes) -> bytes:
    """A non-ALLOC `.modinfo` (wrong vermagic) before the real one."""
    name = elf.sections(e)[elf.index_of(e, ".modinfo")]["name"]
    return elf.set_section(e, ".zdecoy", flags=0, name=int(name))


def _modinfo(payload: bytes, old: bytes, new: bytes) -> bytes:
    """Replace `old` by `new` (NUL-padded to the same length) inside .modinfo."""
    assert len(new) <= len(old) and old in payload
    return payload.replace(old, new + b"\0" * (len(old) - len(new)), 1)


def _vermagic(module: bytes) -> bytes:
    """The module's `vermagic=...` string (without its NUL): the release it was built for."""
    match = re.search(rb"vermagic=[^\0]+", module)
    assert match, "the base module has no vermagic"
    return match[0]


# the cases that edit a __versions section: the modules built for a kernel without
# CONFIG_MODVERSIONS (Debian's 7.2) have none, and the kernel reads none
NEED_VERSIONS = frozenset({
    "release-other-no-crcs", "no-crcs-same-vermagic", "crc-module-layout", "crc-other-symbol",
    "unknown-symbol-not-in-versions", "missing-from-versions", "crc-gpl-symbol",
    "crc-namespaced-symbol", "crc-weak-symbol",
})  # fmt: skip


def modinfo(g: Generator) -> None:
    """vermagic and modversions: what `same_magic` and `check_version` decide."""
    vm = _vermagic(g.base)  # b"vermagic=6.1.0-57-amd64 SMP preempt mod_unload modversions "
    release = vm.split(b"=")[1].split()[0].removesuffix(b"-amd64")  # b"6.1.0-57"
    other = release[:-1] + bytes([ord("0") + (release[-1] - ord("0") + 1) % 10])  # b"6.1.0-58"
    short = b".".join(release.split(b".")[:2])  # b"6.1", b"6.12"
    unversioned = lambda e: elf.set_section(e, "__versions", flags=0)  # noqa: E731
    edits: dict[str, Callable[[bytes], bytes]] = {
        "flags-no-preempt": lambda e: _modinfo(e, vm, vm.replace(b"preempt ", b"")),
        "flags-no-modversions": lambda e: _modinfo(e, vm, vm.replace(b"modversions ", b"")),
        "flags-no-trailing-space": lambda e: _modinfo(e, vm, vm[:-1]),
        "flags-changed-letter": lambda e: _modinfo(e, vm, vm.replace(b"SMP", b"SMX")),
        "release-other-with-crcs": lambda e: _modinfo(e, vm, vm.replace(release, other)),
        "release-other-no-crcs": lambda e: unversioned(_modinfo(e, vm, vm.replace(release, other))),
        "release-short-with-crcs": lambda e: _modinfo(
            e, vm, vm.replace(release + b"-amd64", short)
        ),
        "vermagic-missing": lambda e: _modinfo(e, vm, b"vermagiX" + vm[8:]),
        "vermagic-empty": lambda e: _modinfo(e, vm, b"vermagic="),
        "no-crcs-same-vermagic": unversioned,
        "crc-module-layout": lambda e: elf.flip_version_crc(e, b"module_layout"),
        "crc-other-symbol": lambda e: elf.flip_version_crc(e, None),
        "name-mismatch": lambda e: _modinfo(e, b"name=msorc_", b"name=msorX_"),
        "name-of-a-builtin": lambda e: re.sub(rb"msorc_\d{5}", b"rsa_generic", e),
        "name-of-a-builtin-with-params": lambda e: re.sub(rb"msorc_\d{5}", b"pci_hotplug", e),
        # /sys/module entries of built-in code, as the kernel names them (kernel/params.c):
        # by a parameter's prefix (kfence's are `kfence.*`, its object is mm/kfence/core.o;
        # not on 6.1), by MODULE_PARAM_PREFIX (block.*, rcutree.*), and `kernel` for
        # core_param; `core` is what modules.builtin.modinfo calls kfence's parameters, and
        # no /sys/module entry has that name
        "name-of-a-param-prefix-kfence": lambda e: _named_as(e, b"kfence"),
        "name-of-a-param-prefix-block": lambda e: _named_as(e, b"block"),
        "name-of-a-param-prefix-rcutree": lambda e: _named_as(e, b"rcutree"),
        "name-of-core-params": lambda e: _named_as(e, b"kernel"),
        "name-of-an-object-in-builtin-modinfo": lambda e: _named_as(e, b"core"),
        # a `module:` namespace is implicit where the loader knows them (7.2: EPERM for an
        # explicit import, setup_modinfo); elsewhere an import nothing uses
        "import-a-module-namespace": lambda e: _modinfo(
            e, b"description=modstage oracle case", b"import_ns=module:kvm"
        ),
    }
    if not elf.has_section(g.base, "__versions"):  # a kernel without MODVERSIONS (7.2)
        edits = {k: v for k, v in edits.items() if k not in NEED_VERSIONS}
    for label, edit in edits.items():
        g.add("modinfo", label, g.sign_file(edit(g.payload())))


def _named_as(module: bytes, name: bytes) -> bytes:
    """`module` renamed `name` (no longer than the built name; NUL-padded) where the kernel
    reads its name: `.modinfo`'s `name=` and the name in `.gnu.linkonce.this_module`."""
    match = re.search(rb"name=(msorc_\d{5})\0", module)
    assert match, "the payload has no name= of a renamed base module"
    old = match[1]
    module = _modinfo(module, b"name=" + old, b"name=" + name)
    at, _size = elf.section_data(module, ".gnu.linkonce.this_module")
    at += 24  # struct module: state, list, then name[56]
    assert module[at : at + len(old)] == old
    return module[:at] + name.ljust(len(old), b"\0") + module[at + len(old) :]


def _gzip_flags(data: bytes, flags: int) -> bytes:
    """A gzip member with FEXTRA (4) / FNAME (8) / FCOMMENT (16) fields set."""
    body = gzip.compress(data, mtime=0)
    header = bytearray(body[:10])
    header[3] = flags
    extra = b""
    if flags & 4:
        extra += b"\x04\x00ab\x00\x00"
    if flags & 8:
        extra += b"msorc.ko\0"
    if flags & 16:
        extra += b"comment\0"
    return bytes(header) + extra + body[10:]


def compression(g: Generator) -> None:
    """Compressed modules: kinds, stream options, trailing data, truncation, content vs suffix."""
    for kind in ("xz", "gz", "zst"):
        g.add("compress", f"{kind}", compress(g.good(), kind), kind)
        g.add("compress", f"{kind}-trailing-junk", compress(g.good(), kind) + b"junk", kind)
        g.add("compress", f"{kind}-truncated", compress(g.good(), kind)[:-8], kind)
        g.add("compress", f"{kind}-unsigned", compress(g.payload(), kind), kind)
        g.add("compress", f"{kind}-as-plain-ko", compress(g.good(), kind), kind, suffix=".ko")
    g.add("compress", "xz-check-sha256", lzma.compress(g.good(), check=lzma.CHECK_SHA256), "xz")
    g.add("compress", "xz-check-none", lzma.compress(g.good(), check=lzma.CHECK_NONE), "xz")
    g.add("compress", "xz-two-streams", compress(g.good(), "xz") + compress(b"more", "xz"), "xz")
    g.add("compress", "gz-fname", _gzip_flags(g.good(), 8), "gz")
    g.add("compress", "gz-fcomment", _gzip_flags(g.good(), 16), "gz")
    g.add("compress", "gz-fextra", _gzip_flags(g.good(), 4), "gz")
    g.add(
        "compress",
        "gz-two-members",
        gzip.compress(g.good(), mtime=0) + gzip.compress(b"x", mtime=0),
        "gz",
    )
    zst = zstandard.ZstdCompressor(write_checksum=True, write_content_size=False)
    g.add("compress", "zst-checksum-no-size", zst.compress(g.good()), "zst")
    g.add("compress", "plain-ko-as-xz", g.good(), "", suffix=".ko.xz")


def randomized(g: Generator, count: int = 40) -> None:
    """Seeded mixtures of key, digest, sid, embedded certificates and an extra signer."""
    creds = ["ca", *SECONDARY, "p256", "chain2048", "chain1024", "stranger"]
    digests = ["sha256", "sha384", "sha512", "sha224", "sha3-256", "sha1"]
    for i in range(count):
        cred, digest = g.rng.choice(creds), g.rng.choice(digests)
        sid = g.rng.choice(["issuer", "skid"])
        certs = (g.pki[cred].der,) if g.rng.random() < 0.4 else ()
        extra = [g.signer(g.rng.choice(creds))] if g.rng.random() < 0.3 else []
        signer = g.signer(cred, digest=digest, sid=sid)
        order = [signer, *extra] if g.rng.random() < 0.5 else [*extra, signer]
        label = (
            f"{i:02d}-{cred}-{digest}-{sid}{'-emb' if certs else ''}{'-2signers' if extra else ''}"
        )
        g.add("random", label, g.cms(g.payload(), Cms(tuple(order), certs=certs)))


def edges(g: Generator) -> None:
    """Boundary cases of the PKCS#7 fields and of embedded chains."""
    s, pki = g.signer, g.pki
    chain = pki["chain2048"].der
    broken = chain[:-4] + bytes(b ^ 0xFF for b in chain[-4:])
    expired = reissue(pki, "chain2048", 500, not_after=dt.datetime(2021, 1, 1, tzinfo=dt.UTC))
    as_ca = reissue(pki, "chain2048", 501, is_ca=True)
    ca_issuer, _, ca_skid = cert_parts(pki.ca.der)
    pkcs7_cases: dict[str, Cms] = {
        "signers-empty": Cms(()),
        "no-content": Cms((s(),), no_content=True),
        "sd-extra-field": Cms((s(),), sd_extra=der.tlv(0xA2, der.null())),
        "digest-params-integer": Cms((s(digest_params=der.integer(5)),)),
        "digest-set-md5-only": Cms((s(),), digest_algorithms=("md5",)),
        "signature-leading-zero": Cms((s(signature_pad=b"\0"),)),
        "sid-skid-empty": Cms((s(sid="skid", sid_raw=der.tlv(0x80, b"")),)),
        "sid-skid-of-ca-wrong-key": Cms((s("rsa2048", sid="skid", sid_raw=der.tlv(0x80, ca_skid)),)),
        "serial-zero": Cms((s(sid_raw=der.seq(ca_issuer, der.integer(0))),)),
        "serial-negative": Cms((s(sid_raw=der.seq(ca_issuer, der.integer(-1))),)),
    }  # fmt: skip
    for label, cms in pkcs7_cases.items():
        g.add("pkcs7", label, g.cms(g.payload(), cms))
    keys_cases: dict[str, Cms] = {
        "chain2048-broken-cert-signature": Cms((s("chain2048"),), certs=(broken,)),
        "chain2048-expired": Cms((s("chain2048", sid_raw=der.seq(ca_issuer, der.integer(500))),), certs=(expired,)),
        "chain2048-as-ca": Cms((s("chain2048", sid_raw=der.seq(ca_issuer, der.integer(501))),), certs=(as_ca,)),
        "chain2048-embedded-twice": Cms((s("chain2048"),), certs=(chain, chain)),
        "secondary-leaf-embedded-too": Cms((s("rsa3072"),), certs=(pki["rsa3072"].der,)),
    }  # fmt: skip
    for label, cms in keys_cases.items():
        g.add("keys", label, g.cms(g.payload(), cms))


def edges_signers_and_files(g: Generator) -> None:
    """Signers the kernel skips next to a good one; trailer, ELF and xz boundaries."""
    s = g.signer
    skipped = {
        "good+sha3-signer": (s(), s("rsa3072", digest="sha3-256")),
        "sha3-signer+good": (s("rsa3072", digest="sha3-256"), s()),
        "good+pss-signer": (s(), s("rsa3072", sig_alg="rsassa-pss")),
        "good+wrong-key-type": (s(), s("rsa3072", sig_alg="ecdsa-with-sha256")),
        "good+attrs-signer": (s(), s("rsa3072", attrs=())),
        "good+sha1-signer": (s(), s("rsa3072", digest="sha1")),
        "good+md5-signer": (s(), s("rsa3072", digest="md5")),
    }
    for label, signer_tuple in skipped.items():
        g.add("signers", label, g.cms(g.payload(), Cms(signer_tuple)))
    good = g.good()
    g.add("trailer", "sig-len-boundary", replace(split(good), sig_len=len(good) - 40).to_bytes())
    g.add("trailer", "tiny-file", b"\0" * 12 + b"~Module signature appended~\n")
    # Not generated: a .gnu.linkonce.this_module smaller than struct module (sh_size 0x100)
    # oopses 6.1 in add_kallsyms and kills the guest (found by this oracle); modstage must
    # refuse it, see tests/vm/test_oracle.py::test_short_this_module_oopses_the_kernel.
    edits: dict[str, Callable[[bytes], bytes]] = {
        "e-shnum-0": lambda e: elf.set_header(e, "shnum", 0),
        "symtab-entsize-0": lambda e: elf.set_section(e, ".symtab", entsize=0),
        "modinfo-beyond-file": lambda e: elf.set_section(e, ".modinfo", offset=1 << 30),
    }  # fmt: skip
    for label, edit in edits.items():
        g.add("elf", label, g.sign_file(edit(g.payload())))
    alone = lzma.compress(g.good(), format=lzma.FORMAT_ALONE)  # not xz: loaded as it is
    g.add("compress", "lzma-alone-as-xz", alone, "", suffix=".ko.xz")
    bcj = [{"id": lzma.FILTER_X86}, {"id": lzma.FILTER_LZMA2, "preset": 6}]
    g.add("compress", "xz-bcj-filter", lzma.compress(g.good(), filters=bcj), "xz")


# The symbols module's imports (kmod/msors_00000.c), all vmlinux exports on Debian's 6.1, and
# same-length replacements that nothing exports (checked against Module.symvers by the tests).
# OTHER_NS is a real namespace (hid-sensor-iio-common's), just not dma_buf_put's.
NORMAL, UNEXPORTED = b"_printk", b"_printq"
WEAK, WEAK_UNEXPORTED = b"strim", b"strym"
GPL_ONLY, NAMESPACED = b"kobject_create_and_add", b"dma_buf_put"
IMPORT_NS, OTHER_NS = b"import_ns=DMA_BUF\0", b"import_ns=IIO_HID\0"
LICENSE, NOT_GPL = b"license=GPL\0", b"license=BSD\0"


def _unexported(payload: bytes, old: bytes, new: bytes) -> bytes:
    """`payload` importing `new` instead of `old` (symbol table and __versions alike)."""
    renamed = elf.rename_symbol(payload, old, new)
    if not elf.has_section(payload, "__versions"):
        return renamed
    return elf.rename_version(renamed, old, new)


def _relicensed(payload: bytes) -> bytes:
    """`payload` under a license that is not GPL-compatible (the kernel taints it P)."""
    return elf.replace_in_section(payload, ".modinfo", LICENSE, NOT_GPL)


def symbols(g: Generator) -> None:
    """What resolve_symbol and simplify_symbols refuse: an unknown import (unless weak), an
    import missing from __versions, a GPL-only import of a non-GPL module, a namespace not
    imported, a CRC mismatch on a GPL-only, namespaced or weak import. The controls: the
    symbols module as built, and a non-GPL module importing no GPL-only symbol."""
    edits: dict[str, Callable[[bytes], bytes]] = {
        "control": lambda e: e,
        "unknown-symbol": lambda e: _unexported(e, NORMAL, UNEXPORTED),
        "unknown-symbol-not-in-versions": lambda e: elf.rename_symbol(e, NORMAL, UNEXPORTED),
        "unknown-weak-symbol": lambda e: _unexported(e, WEAK, WEAK_UNEXPORTED),
        "missing-from-versions": lambda e: elf.rename_version(e, NORMAL, UNEXPORTED),
        "gpl-only-from-non-gpl": _relicensed,
        "namespace-not-imported": lambda e: elf.replace_in_section(
            e, ".modinfo", IMPORT_NS, OTHER_NS
        ),
        "crc-gpl-symbol": lambda e: elf.flip_version_crc(e, GPL_ONLY),
        "crc-namespaced-symbol": lambda e: elf.flip_version_crc(e, NAMESPACED),
        "crc-weak-symbol": lambda e: elf.flip_version_crc(e, WEAK),
    }
    if not elf.has_section(g.symbols, "__versions"):  # a kernel without MODVERSIONS (7.2)
        edits = {k: v for k, v in edits.items() if k not in NEED_VERSIONS}
    for label, edit in edits.items():
        g.add("symbols", label, g.sign_file(edit(g.symbols_payload())))
    g.add("symbols", "non-gpl-without-gpl-imports", g.sign_file(_relicensed(g.payload())))


CATEGORIES = (
    baseline,
    ecdsa,
    keys,
    signers,
    pkcs7,
    trailer,
    elf_cases,
    modinfo,
    compression,
    edges,
    edges_signers_and_files,
    randomized,
    symbols,
)


def generate(
    pki: Pki,
    workdir: Path,
    seed: int = SEED,
    categories: tuple[Callable[[Generator], None], ...] = CATEGORIES,
) -> list[Case]:
    """Every case, in a fixed order; the same seed gives the same cases, byte for byte."""
    workdir.mkdir(parents=True, exist_ok=True)
    g = Generator(pki, workdir, seed)
    for category in categories:
        category(g)
    return g.cases

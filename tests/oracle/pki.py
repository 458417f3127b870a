"""The oracle's keys and certificates, made once with `cryptography` and cached on disk.

* `ca`: RSA-2048 (or, for Debian 13's 6.12, P-256: see `ca_kind`), self-signed, CA:TRUE; the
  guest kernel's only built-in trusted key and the issuer of every leaf below.
* `secondary` leaves (RSA of every size the kernel knows plus odd sizes, P-256, P-384): added
  to `.secondary_trusted_keys` in the guest at run time (the kernel refuses the ones it cannot
  use) and all put in modstage's trusted directory, as an admin would configure them.
* `chain` leaves: issued by the CA but in no keyring and not trusted by modstage; they reach
  the kernel only embedded in the PKCS#7 (a chain from an embedded leaf to the CA).
* `stranger`: self-signed, trusted nowhere. `forged`: same issuer and serial as `rsa2048`,
  another key.

Keys are cached (RSA generation is slow and not seedable), so a rerun signs identically.
"""

from __future__ import annotations

import datetime as dt
import fcntl
import os
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa
from cryptography.x509.oid import NameOID

from tests.kmod.build import cache_root

PrivateKey = rsa.RSAPrivateKey | ec.EllipticCurvePrivateKey
VERSION = "v1"
SECONDARY = ("rsa1024", "rsa1536", "rsa2048", "rsa3072", "rsa4096", "rsa2040", "rsa3000")
SECONDARY_EC = ("p256", "p384")
CHAIN = ("chain1024", "chain2048", "chain4096", "chain2056", "chainp256")
NOT_BEFORE = dt.datetime(2020, 1, 1, tzinfo=dt.UTC)
NOT_AFTER = dt.datetime(2120, 1, 1, tzinfo=dt.UTC)


@dataclass(frozen=True)
class Cred:
    """A private key and its certificate; `pem_key`/`pem_cert` are files (for sign-file)."""

    name: str
    key: PrivateKey
    cert: x509.Certificate
    pem_key: Path
    pem_cert: Path

    @property
    def der(self) -> bytes:
        """The certificate's DER."""
        return self.cert.public_bytes(serialization.Encoding.DER)

    @property
    def is_ec(self) -> bool:
        """Whether the key is an EC key."""
        return isinstance(self.key, ec.EllipticCurvePrivateKey)


def _new_key(kind: str) -> PrivateKey:
    if kind.endswith("p256"):
        return ec.generate_private_key(ec.SECP256R1())
    if kind.endswith("p384"):
        return ec.generate_private_key(ec.SECP384R1())
    bits = int("".join(c for c in kind if c.isdigit()))
    return rsa.generate_private_key(public_exponent=65537, key_size=bits)


def _name(cn: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, cn)])


def _cert(
    subject: str,
    key: PrivateKey,
    issuer: tuple[str, PrivateKey] | None,
    serial: int,
    is_ca: bool,
) -> x509.Certificate:
    issuer_name, issuer_key = (subject, key) if issuer is None else issuer
    skid = x509.SubjectKeyIdentifier.from_public_key(key.public_key())
    akid = x509.AuthorityKeyIdentifier.from_issuer_public_key(issuer_key.public_key())
    usage = dict.fromkeys(
        ("content_commitment", "key_encipherment", "data_encipherment", "key_agreement"), False
    )
    builder = (
        x509.CertificateBuilder()
        .subject_name(_name(subject))
        .issuer_name(_name(issuer_name))
        .public_key(key.public_key())
        .serial_number(serial)
        .not_valid_before(NOT_BEFORE)
        .not_valid_after(NOT_AFTER)
        .add_extension(x509.BasicConstraints(ca=is_ca, path_length=None), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True,
                key_cert_sign=is_ca,
                crl_sign=is_ca,
                encipher_only=False,
                decipher_only=False,
                **usage,
            ),
            critical=False,
        )
        .add_extension(skid, critical=False)
        .add_extension(akid, critical=False)
    )
    return builder.sign(issuer_key, hashes.SHA256())


def _store(directory: Path, name: str, key: PrivateKey, cert: x509.Certificate) -> Cred:
    pem_key, pem_cert = directory / f"{name}.key", directory / f"{name}.pem"
    for path, data in (
        (
            pem_key,
            key.private_bytes(
                serialization.Encoding.PEM,
                serialization.PrivateFormat.PKCS8,
                serialization.NoEncryption(),
            ),
        ),
        (pem_cert, cert.public_bytes(serialization.Encoding.PEM)),
    ):
        tmp = path.with_name(f".{path.name}.{os.getpid()}")
        tmp.write_bytes(data)
        os.replace(tmp, path)
    return Cred(name, key, cert, pem_key, pem_cert)


def _load(directory: Path, name: str) -> Cred | None:
    pem_key, pem_cert = directory / f"{name}.key", directory / f"{name}.pem"
    if not (pem_key.is_file() and pem_cert.is_file()):
        return None
    key = serialization.load_pem_private_key(pem_key.read_bytes(), None)
    assert isinstance(key, rsa.RSAPrivateKey | ec.EllipticCurvePrivateKey)
    return Cred(name, key, x509.load_pem_x509_certificate(pem_cert.read_bytes()), pem_key, pem_cert)


@dataclass(frozen=True)
class Pki:
    """Every credential of the oracle, by name (see the module docstring)."""

    creds: dict[str, Cred]
    directory: Path

    def __getitem__(self, name: str) -> Cred:
        return self.creds[name]

    @property
    def ca(self) -> Cred:
        """The built-in CA."""
        return self.creds["ca"]

    def secondary(self) -> list[Cred]:
        """The leaves meant for `.secondary_trusted_keys` (and modstage's trusted directory)."""
        return [self.creds[n] for n in (*SECONDARY, *SECONDARY_EC)]


def _plan() -> list[tuple[str, str, str | None, int, bool]]:
    """(name, subject CN, issuer name or None, serial, is_ca) in creation order."""
    plan: list[tuple[str, str, str | None, int, bool]] = [
        ("ca", "modstage oracle CA", None, 1, True)
    ]
    for i, name in enumerate((*SECONDARY, *SECONDARY_EC, *CHAIN), start=100):
        plan.append((name, f"modstage oracle {name}", "ca", i, False))
    plan.append(("inter", "modstage oracle intermediate", "ca", 200, True))
    plan.append(("interleaf", "modstage oracle interleaf", "inter", 201, False))
    plan.append(("stranger", "modstage oracle stranger", None, 300, False))
    plan.append(("forged", "modstage oracle rsa2048", "ca", 102, False))  # rsa2048's id
    return plan


CA_KINDS = ("rsa2048", "p256")


def ca_kind(builtin_slot: int) -> str:
    """The CA's key for a kernel whose built-in certificate takes `builtin_slot` bytes: the CA
    replaces that certificate in place. Debian 12's build key is RSA-4096 (1,324 bytes: an
    RSA-2048 CA fits); Debian 13's is ECDSA P-384 (476 bytes: the smallest RSA CA with its
    extensions is 534, a P-256 CA 399)."""
    return "rsa2048" if builtin_slot >= 800 else "p256"


def load_pki(ca: str = "rsa2048") -> Pki:
    """The oracle's credentials with a CA of kind `ca` (CA_KINDS), created on first use under
    the test cache."""
    assert ca in CA_KINDS, ca
    suffix = "" if ca == "rsa2048" else f"-ca-{ca}"
    directory = cache_root() / f"oracle-pki-{VERSION}{suffix}"
    directory.mkdir(parents=True, exist_ok=True)
    creds: dict[str, Cred] = {}
    with open(directory / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        for name, cn, issuer, serial, is_ca in _plan():
            cred = _load(directory, name)
            if cred is None:
                kind = "rsa2048" if name in ("inter", "interleaf", "stranger") else name
                kind = ca if name == "ca" else kind
                key = _new_key("rsa2048" if name == "forged" else kind)
                issuer_pair = (
                    None if issuer is None else (_cn(creds[issuer].cert), creds[issuer].key)
                )
                cert = _cert(cn, key, issuer_pair, serial, is_ca)
                cred = _store(directory, name, key, cert)
            creds[name] = cred
    return Pki(creds, directory)


def _cn(cert: x509.Certificate) -> str:
    return str(cert.subject.get_attributes_for_oid(NameOID.COMMON_NAME)[0].value)


def reissue(
    pki: Pki,
    name: str,
    serial: int,
    *,
    not_before: dt.datetime = NOT_BEFORE,
    not_after: dt.datetime = NOT_AFTER,
    is_ca: bool = False,
) -> bytes:
    """DER of a new CA-issued certificate for `name`'s key (deterministic: RSA signatures)."""
    cert = _cert(_cn(pki[name].cert), pki[name].key, (_cn(pki.ca.cert), pki.ca.key), serial, is_ca)
    builder = (
        x509.CertificateBuilder()
        .subject_name(cert.subject)
        .issuer_name(cert.issuer)
        .public_key(cert.public_key())  # type: ignore[arg-type]
        .serial_number(serial)
        .not_valid_before(not_before)
        .not_valid_after(not_after)
    )
    for extension in cert.extensions:
        builder = builder.add_extension(extension.value, extension.critical)
    return builder.sign(pki.ca.key, hashes.SHA256()).public_bytes(serialization.Encoding.DER)  # type: ignore[arg-type]


def issue(
    pki: Pki, name: str, serial: int, cn: str, extensions: list[x509.ExtensionType], out: Path
) -> Cred:
    """A certificate the CA issues for `name`'s key with exactly `extensions` (non-critical)
    and an authorityKeyIdentifier (the secondary keyring finds its issuer by it), no
    subjectKeyIdentifier (so one key can have several); written under `out` as `<cn>.pem`."""
    builder = (
        x509.CertificateBuilder()
        .subject_name(_name(cn))
        .issuer_name(pki.ca.cert.subject)
        .public_key(pki[name].key.public_key())
        .serial_number(serial)
        .not_valid_before(NOT_BEFORE)
        .not_valid_after(NOT_AFTER)
        .add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_public_key(pki.ca.key.public_key()), False
        )
    )
    for extension in extensions:
        builder = builder.add_extension(extension, critical=False)
    cert = builder.sign(pki.ca.key, hashes.SHA256())
    out.mkdir(parents=True, exist_ok=True)
    return _store(out, cn.replace(" ", "-"), pki[name].key, cert)

"""``status`` names each module's signer as the kernel names the key and reports a live module
the kernel loaded without a trusted signature as "loaded unverified (kernel tainted)".

Generations are real: modules signed by sign-file, taken in by intake into the host's store.
The kernel's facts are a temporary procfs/sysfs tree; the keyrings a recording fake.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from cryptography import x509

from service.bundles.phase import Phase
from service.bundles.records import ModuleLoad
from service.bundles.state import BundleState, Generation
from service.layout import Layout
from service.status.report import SignerRow
from service.status.signer_rows import (
    UNVERIFIED,
    VERIFIED,
    loaded_verdict,
    signer_lines,
    signer_rows,
)
from service.status.view import signer_text
from service.verify.signature.keyring import KeyDescription
from tests.kmod import SigningKey, sign
from tests.service.fakes import pending


class Keyrings:
    """The kernel's keyrings: ``held`` maps key ids (hex) to the keyring holding them;
    ``keys`` is what /proc/keys describes. Records every key id asked about."""

    def __init__(
        self, held: dict[str, str] | None = None, keys: tuple[KeyDescription, ...] = ()
    ) -> None:
        self.held, self.keys = held or {}, keys
        self.asked: list[str] = []

    def where(self, key_id: str) -> str | None:
        self.asked.append(key_id)
        return self.held.get(key_id)

    def visible(self) -> bool:
        return True

    def descriptions(self) -> tuple[KeyDescription, ...]:
        return self.keys


def kernel_ids(key: SigningKey) -> tuple[str, str, str]:
    """(serial, SKID, serial || issuer) in hex, computed with ``cryptography``: the kernel's
    raw serial INTEGER content octets (a sign byte when the top bit is set), the raw SKID."""
    cert = x509.load_pem_x509_certificate(key.cert_pem.read_bytes())
    n = cert.serial_number
    serial = n.to_bytes((n.bit_length() + 8) // 8, "big")
    skid = cert.extensions.get_extension_for_class(x509.SubjectKeyIdentifier).value.digest
    issuer = cert.issuer.public_bytes()
    content = issuer[2:] if issuer[1] < 0x80 else issuer[2 + (issuer[1] & 0x7F) :]
    return serial.hex(), skid.hex(), (serial + content).hex()


def active(generation: str, version: str, kernel: str, module: str) -> BundleState:
    """A bundle whose ``generation`` came up with ``module`` loaded."""
    b = BundleState().with_generation(Generation(generation, version, kernel, added=1.0))
    b = b.move(Phase.PENDING, pending=generation).move(Phase.LOADING)
    loaded = (ModuleLoad(module, "SRC", 1.0),)
    return b.move(Phase.ACTIVE, active=generation, pending=None, loaded=loaded, note="up")


def kernel_facts(
    layout: Layout, *, mask: int, taint: str | None, enforce: str = "N", module: str = "ms_params"
) -> None:
    """The running kernel: ``sig_enforce``, the taint mask, and ``module`` live with
    ``taint`` letters (None: no taint file)."""
    layout.sig_enforce.parent.mkdir(parents=True, exist_ok=True)
    layout.sig_enforce.write_text(enforce + "\n")
    layout.tainted.write_text(f"{mask}\n")
    base = layout.sys / "module" / module
    base.mkdir(parents=True, exist_ok=True)
    if taint is not None:
        (base / "taint").write_text(taint + "\n")


@pytest.fixture
def generation(host: Layout, kernel: str, signed: dict[str, Path]) -> str:
    """ms_params signed by the trusted RSA key (issuer+serial), taken into the store."""
    return pending(host, kernel, [(signed["ms_params"], "")], version="1.0")


def test_a_known_certificate_names_the_key_by_subject_and_skid_as_the_kernel_does(
    host: Layout, kernel: str, generation: str, rsa_key: SigningKey
) -> None:
    """The signature names issuer and serial, the trusted certificate has an SKID: the signer
    is "<subject>: <SKID>" (x509_key_preparse's description), with the certificate's path,
    the whole issuer, the serial and the SKID; the keyring is asked for serial || issuer."""
    serial, skid, key_id = kernel_ids(rsa_key)
    ring = Keyrings({key_id: "machine"})
    [row] = signer_rows(host, active(generation, "1.0", kernel, "ms_params"), ring)
    assert row.signer == f"modstage rsa: {skid}"
    assert (row.key_id, row.keyring, row.serial, row.skid) == (key_id, "machine", serial, skid)
    assert row.issuer == "CN=modstage rsa" and row.version == "1.0"
    assert row.certificate == str(host.trusted / rsa_key.cert_pem.name)
    assert ring.asked == [key_id]


def test_without_the_certificate_the_signature_names_issuer_and_serial(
    host: Layout, kernel: str, generation: str, rsa_key: SigningKey
) -> None:
    """Only the signature is known (no trusted certificate, no key in a keyring): the signer
    is the issuer's name and the serial, "<issuer>: <serial>", and no certificate."""
    serial, _, _ = kernel_ids(rsa_key)
    shutil.rmtree(host.trusted)
    [row] = signer_rows(host, active(generation, "1.0", kernel, "ms_params"), Keyrings())
    assert (row.signer, row.certificate, row.skid) == (f"modstage rsa: {serial}", None, None)
    assert row.issuer == "CN=modstage rsa"


def test_a_signature_by_skid_alone_names_the_skid(
    host: Layout, kernel: str, modules: dict[str, Path], rsa_key: SigningKey, tmp_path: Path
) -> None:
    """sign-file -k names the key by its SKID only, which carries no name: without the
    certificate the signer is "(unknown subject): <SKID>", the key id the SKID."""
    _, skid, _ = kernel_ids(rsa_key)
    module = sign(modules["ms_params"], rsa_key, tmp_path / "ms_params.ko", skid=True)
    gen = pending(host, kernel, [(module, "")], version="1.0")
    shutil.rmtree(host.trusted)
    [row] = signer_rows(host, active(gen, "1.0", kernel, "ms_params"), Keyrings())
    assert (row.signer, row.key_id, row.issuer) == (f"(unknown subject): {skid}", skid, None)


def test_a_key_the_kernel_holds_is_named_by_its_proc_keys_description(
    host: Layout, kernel: str, generation: str, rsa_key: SigningKey
) -> None:
    """No trusted certificate, but a kernel keyring holds the key and /proc/keys describes a
    key without SKID by this serial: the kernel's own description names the signer."""
    serial, _, key_id = kernel_ids(rsa_key)
    shutil.rmtree(host.trusted)
    ring = Keyrings({key_id: "builtin"}, (KeyDescription("Vendor: Module key", serial, None),))
    [row] = signer_rows(host, active(generation, "1.0", kernel, "ms_params"), ring)
    assert (row.signer, row.certificate) == (f"Vendor: Module key: {serial}", "kernel keyring")


def test_a_live_module_no_keyring_trusts_is_loaded_unverified_on_a_tainted_kernel(
    host: Layout, kernel: str, generation: str
) -> None:
    """Not enforcing, no keyring holds the signer, the module's taint has E and the kernel's
    mask bit 13 (TAINT_UNSIGNED_MODULE, 8192) plus O (4096): "loaded unverified (kernel
    tainted)" on the signer's line, ``loaded`` "unverified" and the letters in the row."""
    kernel_facts(host, mask=8192 | 4096, taint="OE")
    rows = signer_rows(host, active(generation, "1.0", kernel, "ms_params"), Keyrings())
    assert (rows[0].loaded, rows[0].taint, rows[0].keyring) == (UNVERIFIED, "OE", None)
    [line] = signer_lines(rows)
    assert signer_text(line).endswith(
        "for modules/ms_params.ko: trusted by no keyring; loaded unverified (kernel tainted)"
    ), signer_text(line)


def test_a_live_module_without_e_was_verified_and_a_pending_one_has_no_verdict(
    host: Layout, kernel: str, generation: str, signed: dict[str, Path]
) -> None:
    """Taint ``O`` only: the kernel verified the signature ("verified"). The same module in
    the pending generation is not what is loaded: no verdict there."""
    newer = pending(host, kernel, [(signed["ms_params"], "x=1")], version="2.0")
    kernel_facts(host, mask=4096, taint="O")
    b = active(generation, "1.0", kernel, "ms_params")
    b = b.with_generation(Generation(newer, "2.0", kernel, added=2.0)).move(
        Phase.PENDING, pending=newer
    )
    rows = signer_rows(host, b, Keyrings())
    assert [(r.version, r.loaded) for r in rows] == [("1.0", VERIFIED), ("2.0", None)]
    text = [signer_text(s) for s in signer_lines(rows)]
    assert "loaded, verified by the kernel" in text[0] and "loaded" not in text[1], text


@pytest.mark.parametrize(
    ("taint", "mask", "held", "enforced", "verdict"),
    [
        ("OE", 12288, False, False, UNVERIFIED),
        ("E", 0, True, True, UNVERIFIED),  # the module's own letters decide when present
        ("O", 12288, False, False, VERIFIED),
        ("", 0, True, False, VERIFIED),
        (None, 12288, False, False, UNVERIFIED),  # no letters: the kernel's bit 13, untrusted
        (None, 4096, False, False, None),  # bit 13 clear
        (None, 12288, True, False, None),  # a keyring holds it: some other module tainted
        (None, 12288, False, True, None),  # enforcing: it was checked
        (None, 12288, None, False, None),  # keyrings unknown
    ],
)
def test_loaded_verdict_reads_the_modules_e_then_the_kernels_bit_13(
    taint: str | None, mask: int, held: bool | None, enforced: bool, verdict: str | None
) -> None:
    """The verdict is the module's taint letter E when its letters are readable; otherwise
    bit 13 of the kernel's mask counts only for a signer no keyring holds on a kernel not
    enforcing signatures."""
    unsigned = bool(mask >> 13 & 1)
    got = loaded_verdict(
        taint, live=True, checks=True, kernel_unsigned=unsigned, held=held, enforced=enforced
    )
    assert got == verdict
    assert (
        loaded_verdict(
            taint, live=False, checks=True, kernel_unsigned=unsigned, held=held, enforced=enforced
        )
        is None
    )


def test_the_kernel_taint_files_are_read_under_the_root(
    host: Layout, kernel: str, generation: str
) -> None:
    """The mask comes from <root>/proc/sys/kernel/tainted and the letters from
    <root>/sys/module/<name>/taint: without a taint file, the mask's bit 13 still reports
    the live module unverified; without bit 13 nothing is said."""
    b = active(generation, "1.0", kernel, "ms_params")
    kernel_facts(host, mask=8192, taint=None)
    assert [r.loaded for r in signer_rows(host, b, Keyrings())] == [UNVERIFIED]
    kernel_facts(host, mask=0, taint=None)
    assert [r.loaded for r in signer_rows(host, b, Keyrings())] == [None]


def test_signer_lines_group_modules_per_signer_and_generation() -> None:
    """Rows of one generation signed by one key make one line listing the modules; a verdict
    shared by all of them is said once, differing verdicts per module."""
    a, b = "a" * 64, "b" * 64
    rows = (
        SignerRow(a, "x.ko", "k", None, version="1", signer="S: 01", loaded=UNVERIFIED),
        SignerRow(a, "y.ko", "k", None, version="1", signer="S: 01", loaded=UNVERIFIED),
        SignerRow(b, "x.ko", "k", None, version="2", signer="S: 01"),
        SignerRow(b, "u.ko", None, None, "unsigned", version="2"),
    )
    lines = [signer_text(s) for s in signer_lines(rows)]
    assert lines == [
        f"signer of 1 ({a[:12]}) 'S: 01' for x.ko, y.ko: trusted by no keyring; "
        "loaded unverified (kernel tainted)",
        f"signer of 2 ({b[:12]}) 'S: 01' for x.ko: trusted by no keyring",
        f"signer of 2 ({b[:12]}) - for u.ko: unsigned",
    ]
    mixed = (rows[0], SignerRow(a, "y.ko", "k", None, version="1", signer="S: 01"))
    [line] = signer_lines(mixed)
    assert line.loaded == "x.ko loaded unverified (kernel tainted)"

"""Whether the running kernel enforces signatures: absent means no, unreadable means unknown."""

from __future__ import annotations

from pathlib import Path

import pytest

from service.layout import Layout
from service.verify.signature.keyring import enforcing
from stager.drop import ModuleSpec, stage
from tests.kmod import SigningKey, sign
from tests.service.fakes import make_intake


class NeverAsked:
    """A keyring the pre-flight must not ask (the kernel does not enforce, or cannot tell)."""

    def trusts(self, key_id: str, *, platform: bool = False) -> bool:
        raise AssertionError(f"asked about key {key_id}")

    def blacklisted(self, sha256: str) -> bool:
        raise AssertionError(f"asked about hash {sha256}")


def _sig_enforce(layout: Layout) -> Path:
    layout.sig_enforce.parent.mkdir(parents=True, exist_ok=True)
    return layout.sig_enforce


def test_absent_files_mean_not_enforcing_and_y_or_lockdown_mean_enforcing(host: Layout) -> None:
    """No sig_enforce and no lockdown file: None; "Y" or [integrity] name the reason."""
    assert enforcing(host) is None
    _sig_enforce(host).write_text("N\n")
    assert enforcing(host) is None
    host.lockdown.parent.mkdir(parents=True)
    host.lockdown.write_text("none [integrity] confidentiality\n")
    assert enforcing(host) == "lockdown=integrity"
    _sig_enforce(host).write_text("Y\n")
    assert enforcing(host) == "module.sig_enforce=1"


@pytest.mark.parametrize("which", ["sig_enforce", "lockdown"])
def test_an_unreadable_file_is_an_error_naming_it_not_a_no(host: Layout, which: str) -> None:
    """A file that exists but cannot be read (here: a directory) never reads as "not enforcing"."""
    path: Path = getattr(host, which)
    path.mkdir(parents=True)
    with pytest.raises(OSError, match="cannot tell whether the running kernel enforces") as info:
        enforcing(host)
    assert info.value.filename == str(path)


def test_intake_keeps_the_drop_while_enforcement_is_unknown(
    host: Layout, kernel: str, modules: dict[str, Path], rsa_key: SigningKey, tmp_path: Path
) -> None:
    """The pre-flight cannot tell: the drop is deferred (kept) with the file named, not accepted."""
    module = sign(modules["ms_exporter"], rsa_key, tmp_path / "ms_exporter.ko")
    drop = stage(
        host.incoming, bundle="test", version="1", kernel=kernel, modules=[ModuleSpec(module)]
    )
    _sig_enforce(host).mkdir()
    intake = make_intake(host, keyring=NeverAsked())
    [outcome] = intake.run()
    assert outcome.deferred and not outcome.accepted
    assert "sig_enforce" in outcome.reasons[0] and "cannot tell" in outcome.reasons[0]
    assert drop.exists()
    _sig_enforce(host).rmdir()
    [outcome] = intake.run()
    assert outcome.accepted


def test_signer_key_id_reads_the_first_signer_of_plain_and_compressed_modules(
    modules: dict[str, Path], rsa_key: SigningKey, tmp_path: Path
) -> None:
    """`status` names each stored module's signer by the key id the kernel searches for
    (serial || issuer, as sign-file writes it), read from a plain module and from the same
    module xz-compressed; an unsigned module has none."""
    import lzma

    from cryptography import x509

    from service.verify.signature.keyring import signer_key_id

    module = sign(modules["ms_exporter"], rsa_key, tmp_path / "ms_exporter.ko")
    cert = x509.load_pem_x509_certificate(rsa_key.cert_pem.read_bytes())
    serial = cert.serial_number.to_bytes((cert.serial_number.bit_length() + 8) // 8, "big")
    issuer = cert.issuer.public_bytes()
    issuer_content = issuer[2:] if issuer[1] < 0x80 else issuer[2 + (issuer[1] & 0x7F) :]
    expected = (serial + issuer_content).hex()
    assert signer_key_id(module) == expected
    packed = tmp_path / "ms_exporter.ko.xz"
    packed.write_bytes(lzma.compress(module.read_bytes(), check=lzma.CHECK_CRC32))
    assert signer_key_id(packed) == expected
    assert signer_key_id(modules["ms_exporter"]) is None

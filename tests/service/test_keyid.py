"""An untrusted signer is named by issuer and serial, not raw hex."""

from __future__ import annotations

import io
from pathlib import Path

from service.cli import main
from service.verify.signature.keyid import describe_key_id, split_key_id
from tests.kmod import SigningKey, sign


def test_verify_names_an_untrusted_signer_by_issuer_and_serial(
    tmp_path: Path,
    modules: dict[str, Path],
    other_key: SigningKey,
    rsa_key: SigningKey,
    kernel: str,
) -> None:
    """``verify`` prints the untrusted issuer's name and serial (issuer+serial signer)."""
    trusted = tmp_path / "trusted.d"
    trusted.mkdir()
    (trusted / "rsa.pem").write_bytes(rsa_key.cert_pem.read_bytes())
    module = sign(modules["ms_params"], other_key, tmp_path / "m.ko")
    out = io.StringIO()
    assert main(["verify", "--trusted", str(trusted), "--kernel", kernel, str(module)], out) == 1
    line = out.getvalue()
    assert 'signer=issuer "common_name=untrusted" serial 0x' in line, line


def test_a_key_id_that_is_no_issuer_and_serial_stays_hex() -> None:
    """An SKID (or anything else) is shown as 'key id <hex>'."""
    assert split_key_id(bytes(range(20))) is None
    assert describe_key_id("00" * 20) == "key id " + "00" * 20
    assert describe_key_id(None) == "-"

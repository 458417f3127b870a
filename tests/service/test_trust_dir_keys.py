"""A private key never lands in ``trusted.d``: the sandbox copies only the certificate, and
``config check`` and ``status`` warn of one put there by hand."""

from __future__ import annotations

import io
from pathlib import Path

from service.cli import main
from service.layout import Layout
from tests.kmod import SigningKey


def cli(*argv: str) -> tuple[int, str]:
    """``modstage ARGV`` in this process: (exit code, stdout)."""
    out = io.StringIO()
    return main(list(argv), out), out.getvalue()


def test_sandbox_trust_writes_the_certificate_never_the_private_key(
    tmp_path: Path, kernel: str, rsa_key: SigningKey
) -> None:
    """``--trust signing_key.pem`` (the kernel's file: private key and certificate, as
    docs/sandbox.md's example) puts the certificate alone in ``trusted.d``, mode 0644, and
    the sandbox trusts it."""
    both = tmp_path / "signing_key.pem"
    both.write_bytes(rsa_key.key.read_bytes() + rsa_key.cert_pem.read_bytes())
    both.chmod(0o600)
    root = tmp_path / "sandbox"
    code, out = cli("sandbox", str(root), "--kernel", kernel, "--trust", str(both))
    assert code == 0, out
    [written] = Layout(root).trusted.iterdir()
    text = written.read_text()
    assert "PRIVATE KEY" not in text and text.count("BEGIN CERTIFICATE") == 1
    assert written.stat().st_mode & 0o777 == 0o644
    assert cli("config", "check", "--root", str(root))[0] == 0


def test_a_private_key_in_trusted_d_is_warned_of_by_config_check_and_status(
    host: Layout, ec_key: SigningKey
) -> None:
    """The kernel's signing_key.pem copied whole into ``trusted.d``, world-readable: ``config
    check`` still passes but warns, naming the file; ``status`` is degraded, saying why. A
    world-writable ``trusted.d`` is named too."""
    root = ["--root", str(host.root)]
    assert cli("config", "check", *root)[1].count("warning:") == 0
    both = host.trusted / "signing_key.pem"
    both.write_bytes(ec_key.key.read_bytes() + ec_key.cert_pem.read_bytes())
    both.chmod(0o644)
    code, out = cli("config", "check", *root)
    assert code == 0 and f"warning: {both}: holds a private key, world-readable: " in out, out
    code, out = cli("status", *root)
    assert code == 1 and out.startswith("host: DEGRADED") and "holds a private key" in out
    host.trusted.chmod(0o777)
    assert "world-writable: anyone can add a key" in cli("config", "check", *root)[1]

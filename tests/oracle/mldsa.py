"""An ML-DSA-65 signed module for the oracle (tests/vm/test_oracle.py), made in sid's root."""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

from tests.oracle.module import base_module, renamed
from tests.oracle.pki import Pki
from tests.vm.harness import debian
from tests.vm.harness.kernel import Kernel
from tests.vm.harness.kmod import sign_file as sign_file_of


def ml_dsa_signed(kernel: Kernel, pki: Pki, tmp_path: Path) -> tuple[Path, Path]:
    """(an ML-DSA-65 certificate the test CA issued, the base module signed by its key), made
    by the 7.2 root's OpenSSL 3.6 and signed by its own sign-file (the host's OpenSSL 3.0 has
    no ML-DSA)."""
    scratch = Path(tempfile.mkdtemp(prefix="mldsa-", dir=kernel.root / "tmp"))
    inside = f"/tmp/{scratch.name}"
    shutil.copyfile(pki.ca.pem_key, scratch / "ca.key")
    shutil.copyfile(pki.ca.pem_cert, scratch / "ca.pem")
    (scratch / "ext").write_text(
        "keyUsage=critical,digitalSignature\nextendedKeyUsage=codeSigning\n"
        "subjectKeyIdentifier=hash\nauthorityKeyIdentifier=keyid\n"
    )
    (scratch / "m.ko").write_bytes(renamed(base_module(), 90020))
    steps = [
        ["openssl", "genpkey", "-algorithm", "ML-DSA-65", "-out", f"{inside}/k.pem"],
        ["openssl", "req", "-new", "-key", f"{inside}/k.pem", "-subj", "/CN=modstage ML-DSA-65",
         "-out", f"{inside}/req.pem"],
        ["openssl", "x509", "-req", "-in", f"{inside}/req.pem", "-CA", f"{inside}/ca.pem",
         "-CAkey", f"{inside}/ca.key", "-days", "3650", "-set_serial", "4242",
         "-extfile", f"{inside}/ext", "-out", f"{inside}/c.pem"],
        [str(sign_file_of(kernel)), "sha512", f"{inside}/k.pem", f"{inside}/c.pem",
         f"{inside}/m.ko"],
    ]  # fmt: skip
    try:
        for argv in steps:
            debian.chroot(kernel.root, argv)
        cert, module = tmp_path / "mldsa.pem", tmp_path / "mldsa.ko"
        shutil.copyfile(scratch / "c.pem", cert)
        shutil.copyfile(scratch / "m.ko", module)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    return cert, module

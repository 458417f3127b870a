"""The oracle's guest: Debian's kernel with the test CA built in, enforcement switched on late.

`boot_oracle(state_dir)` boots it and prepares it in the order the kernel needs:

1. boot without `module.sig_enforce` (Debian's own modules no longer have a trusted key, so
   the initramfs modules load only while enforcement is off, tainting the kernel `E`);
2. load `sha512_generic` and `sha3_generic` (sha384/sha512/sha3 digests; Debian-signed);
3. add the secondary leaves to `.secondary_trusted_keys` (the kernel checks each one was
   signed by a built-in key and refuses what it cannot parse);
4. `echo 1 > /sys/module/module/parameters/sig_enforce` (one way: it cannot be unset).
"""

from __future__ import annotations

import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tests.kmod.keys import SIGN_FILE
from tests.oracle.pki import Cred, Pki
from tests.vm.harness import Vm
from tests.vm.harness.builtin_key import BuiltinKeyKernel

GUEST = "__import__('tests.oracle.guest', fromlist=['guest'])"
DIGEST_MODULES = ("sha512_generic", "sha3_generic")


@dataclass
class OracleVm:
    """A prepared oracle guest and what its preparation recorded."""

    vm: Vm
    added: dict[str, int]  # secondary leaf -> key serial, or -errno if the kernel refused it

    def guest(self, call: str, timeout: float = 60) -> Any:
        """Evaluate `tests.oracle.guest.<call>` in the guest."""
        return self.vm.eval(f"{GUEST}.{call}", timeout=timeout)


def boot_oracle(state_dir: Path, pki: Pki, **options: Any) -> OracleVm:
    """Boot and prepare the oracle guest (see the module docstring)."""
    vm = Vm.boot(state_dir, name="oracle", kernel=BuiltinKeyKernel.with_cert(pki.ca.der), **options)
    try:
        vm.run(["modprobe", "-a", *DIGEST_MODULES]).check()
        oracle = OracleVm(vm, {})
        for cred in pki.secondary():
            path = vm.put(cred.pem_cert, f"keys/{cred.name}.pem")
            oracle.added[cred.name] = oracle.guest(
                f"add_certificate(__import__('ssl').PEM_cert_to_DER_cert(open({path!r}).read()))"
            )
        vm.run("echo 1 > /sys/module/module/parameters/sig_enforce").check()
    except BaseException:
        vm.close()
        raise
    return oracle


def sign_file(
    data: bytes, cred: Cred, out: Path, hash: str = "sha256", skid: bool = False
) -> bytes:
    """`data` signed by kbuild's sign-file with `cred` (`skid`: sign-file -k)."""
    out.write_bytes(data)
    argv = [str(SIGN_FILE), *(["-k"] if skid else []), hash, str(cred.pem_key), str(cred.pem_cert)]
    proc = subprocess.run([*argv, str(out)], capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        raise RuntimeError(f"sign-file {hash} {cred.name} failed: {proc.stderr.strip()}")
    return out.read_bytes()
